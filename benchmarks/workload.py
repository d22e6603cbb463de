"""The one workload every benchmark variant runs: model, data and training loop.

Everything that differs between torchrun, Ray Train and nbtrain is the
``report`` function passed to :func:`train_loop` and who sets up the process
group; the model, the data, the batch size, the optimizer and the timing are
shared, so the numbers compare like with like.

Run as a script it is the torchrun variant::

    torchrun --nproc_per_node 2 benchmarks/workload.py --steps 200 --warmup 20 --out /tmp/r

Each rank prints one stdout line per step (its "report") and writes
``<out>/torchrun-rank<r>.json`` with the timings.

Times: ``time.time()`` (wall clock, comparable across processes on one
machine) for timestamps, ``time.perf_counter_ns()`` for the cost of one
``report`` call.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

NUM_SAMPLES = 4096
NUM_CLASSES = 10
BATCH_SIZE = 64          # per worker
DATA_SEED = 1234
MODEL_SEED = 0
LR = 0.05


def build_model() -> Any:
    """~86k parameters: two 3x3 convs (32, 64 channels), max-pool, adaptive-avg-pool to 4x4, two linears."""
    import torch
    from torch import nn

    torch.manual_seed(MODEL_SEED)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, NUM_CLASSES),
    )


def make_shard(rank: int, world_size: int) -> tuple[Any, Any]:
    """Synthetic CIFAR-shaped data (3x32x32, 10 classes): a fixed template per class plus
    noise, fixed seed, ``NUM_SAMPLES`` in all; rank ``r`` gets every ``world_size``-th sample."""
    import torch

    gen = torch.Generator().manual_seed(DATA_SEED)
    templates = torch.randn(NUM_CLASSES, 3, 32, 32, generator=gen)
    labels = torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,), generator=gen)
    images = templates[labels] + 0.8 * torch.randn(NUM_SAMPLES, 3, 32, 32, generator=gen)
    return images[rank::world_size].contiguous(), labels[rank::world_size].contiguous()


def ddp_setup(lr: float) -> tuple[int, Any, Any, Any, Any, Any, int]:
    """This rank's part of the job, the process group being up: one torch thread, its shard
    (images, labels), the DDP model, SGD with momentum at ``lr``, the loss, and how many
    whole batches the shard holds. Returns ``(rank, images, labels, model, optimizer, loss_fn, batches)``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    images, labels = make_shard(rank, world_size)
    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return rank, images, labels, model, optimizer, torch.nn.CrossEntropyLoss(), len(images) // BATCH_SIZE


def train_loop(report: Callable[..., Any], *, steps: int, warmup: int, variant: str) -> dict[str, Any]:
    """DDP-train for ``steps`` steps, calling ``report(step=, loss=, t=)`` once per step.

    The caller has already joined the ``torch.distributed`` process group (gloo).
    Returns this rank's timings: per-step end timestamps, per-call ``report`` cost,
    post-warm-up throughput (samples/s, this rank's view of the whole job).
    """
    import torch
    import torch.distributed as dist

    rank, images, labels, model, optimizer, loss_fn, batches = ddp_setup(LR)
    world_size = dist.get_world_size()

    setup_done = time.time()
    step_ends: list[float] = []
    report_ns: list[int] = []
    loss_value = float("nan")
    cpu_at_steady = (time.thread_time(), time.process_time())
    sched_at_steady = _scheduler_counters()
    for step in range(steps):
        start = (step % batches) * BATCH_SIZE
        x, y = images[start:start + BATCH_SIZE], labels[start:start + BATCH_SIZE]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        now = time.time()
        step_ends.append(now)
        if step + 1 == warmup:
            cpu_at_steady = (time.thread_time(), time.process_time())
            sched_at_steady = _scheduler_counters()
        began = time.perf_counter_ns()
        report(step=step + 1, loss=loss_value, t=now)
        report_ns.append(time.perf_counter_ns() - began)

    sched_end = _scheduler_counters()
    thread_cpu = time.thread_time() - cpu_at_steady[0]
    process_cpu = time.process_time() - cpu_at_steady[1]
    measured = step_ends[warmup:]
    step_ms = sorted((b - a) * 1000.0 for a, b in zip(step_ends[max(warmup, 1) - 1:], step_ends[max(warmup, 1):]))
    span = measured[-1] - step_ends[warmup - 1] if warmup >= 1 else measured[-1] - setup_done
    samples = len(measured) * BATCH_SIZE * world_size
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
    except OSError:
        nice = None
    return {
        "variant": variant, "rank": rank, "world_size": world_size, "pid": os.getpid(), "nice": nice,
        "threads": torch.get_num_threads(), "steps": steps, "warmup": warmup, "batch_size": BATCH_SIZE,
        "params": sum(p.numel() for p in model.parameters()),
        "setup_done": setup_done, "first_step_end": step_ends[0],
        "last_step_end": step_ends[-1], "steady_start": step_ends[warmup - 1] if warmup else step_ends[0],
        "samples_per_s": samples / span if span > 0 else None,
        "report_us_median": statistics.median(report_ns[warmup:] or report_ns) / 1000.0,
        "report_us_p90": _quantile([n / 1000.0 for n in (report_ns[warmup:] or report_ns)], 0.9),
        "final_loss": loss_value,
        # where a slow rank's time went: steps that all take longer (less CPU) or a few stalls
        "step_ms_median": statistics.median(step_ms) if step_ms else None,
        "step_ms_p90": _quantile(step_ms, 0.9) if step_ms else None,
        # CPU this rank's training thread / whole process used per second of the steady window
        "train_thread_cpu_share": thread_cpu / span if span > 0 else None,
        "process_cpu_share": process_cpu / span if span > 0 else None,
        # how often other threads took this rank's core, per steady step (Linux only)
        **_per_step(sched_at_steady, sched_end, len(measured)),
    }


def _scheduler_counters() -> dict[str, float] | None:
    """The training thread's time waiting for a core, times it was preempted (from /proc) and
    minor page faults (fresh pages the kernel had to map and zero)."""
    import resource

    try:
        with open("/proc/thread-self/schedstat") as handle:
            wait_ns = int(handle.read().split()[1])
        with open("/proc/thread-self/status") as handle:
            preempted = next(int(line.split(":")[1]) for line in handle
                             if line.startswith("nonvoluntary_ctxt_switches"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return {"runqueue_wait_ms": wait_ns / 1e6, "preemptions": float(preempted),
            "page_faults": float(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)}


def _per_step(before: dict[str, float] | None, after: dict[str, float] | None, steps: int) -> dict[str, float | None]:
    keys = ("runqueue_wait_ms", "preemptions", "page_faults")
    if not before or not after or steps <= 0:
        return {f"{key}_per_step": None for key in keys}
    return {f"{key}_per_step": (after[key] - before[key]) / steps for key in keys}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def write_result(result: dict[str, Any], out_dir: str) -> None:
    path = os.path.join(out_dir, f"{result['variant']}-rank{result['rank']}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)


def _print_report(step: int, loss: float, t: float) -> None:
    print(f"step {step} loss {loss:.4f} t {t:.6f}", flush=True)


def _torchrun_main() -> None:
    import argparse

    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", default="torchrun", help="name in the result files")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        result = train_loop(_print_report, steps=args.steps, warmup=args.warmup, variant=args.variant)
        write_result(result, args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _torchrun_main()
