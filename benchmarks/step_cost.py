"""One training step's CPU in a plain process and in a Ray worker, with and without kept memory.

No DDP, one thread, nothing else training: the benchmark's model and data
(``workload.py``), stepped in a fresh plain Python process and in a Ray actor
on this script's own loopback cluster, alternating. It isolates what the
process a rank runs in costs per step, apart from what other processes take
from the cores::

    python benchmarks/step_cost.py            # 3 rounds, ~2 min

Per variant: median CPU time of the training thread per step (ms) and minor
page faults per step, after 20 warm-up steps. "kept memory" is nbtrain's
``keep_freed_memory()`` (``nbtrain/_cluster/rank/allocator.py``), called before torch loads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workload  # noqa: E402  (a module-level name, so cloudpickle can ship it to the Ray worker by value)

WARMUP = 20


def step_cost(steps: int, keep_memory: bool) -> dict[str, float]:
    """Median training-thread CPU (ms) and mean page faults per step of the benchmark's model."""
    if keep_memory:
        from nbtrain._cluster.rank.allocator import keep_freed_memory

        keep_freed_memory()
    import resource
    import time

    import torch

    torch.set_num_threads(1)
    images, labels = workload.make_shard(0, 2)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=workload.LR, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    cpu_ms = []
    for step in range(steps):
        if step == WARMUP:
            faults_before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        began = time.thread_time()
        start = (step % (len(images) // workload.BATCH_SIZE)) * workload.BATCH_SIZE
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images[start:start + workload.BATCH_SIZE]), labels[start:start + workload.BATCH_SIZE]).backward()
        optimizer.step()
        cpu_ms.append((time.thread_time() - began) * 1000.0)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults_before
    return {"cpu_ms": statistics.median(cpu_ms[WARMUP:]), "page_faults": faults / (steps - WARMUP)}


def _in_plain_process(steps: int, keep_memory: bool) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", str(steps)] + (["--keep-memory"] if keep_memory else []),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keep-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step_cost(args.child, args.keep_memory)))
        return

    from _own_cluster import own_cluster

    results: dict[str, list[dict[str, Any]]] = {}
    with own_cluster("step-cost-", 4):  # before Ray is imported: it sets Ray's token authentication up
        import ray
        from ray import cloudpickle  # Ray's own copy pickles the remote function below

        cloudpickle.register_pickle_by_value(workload)

        @ray.remote(num_cpus=1, max_calls=1)  # a worker process that ran nothing before, every call
        def in_fresh_worker(steps: int, keep_memory: bool) -> dict[str, float]:
            return step_cost(steps, keep_memory)

        for round_ in range(args.rounds):
            for keep_memory in (False, True):
                for where in ("plain process", "Ray worker"):
                    if where == "plain process":
                        result = _in_plain_process(args.steps, keep_memory)
                    else:
                        result = ray.get(in_fresh_worker.remote(args.steps, keep_memory))
                    label = f"{where}, {'kept memory' if keep_memory else 'glibc defaults'}"
                    results.setdefault(label, []).append(result)
                    print(f"round {round_} {label:34s} {result['cpu_ms']:6.1f} ms CPU/step, "
                          f"{result['page_faults']:8.0f} page faults/step", flush=True)
    print("\n| variant | CPU per step (ms, per round) | page faults per step (per round) |\n|---|---|---|")
    for label, rows in results.items():
        cpu = ", ".join(f"{r['cpu_ms']:.1f}" for r in rows)
        faults = ", ".join(f"{r['page_faults']:.0f}" for r in rows)
        print(f"| {label} | {cpu} | {faults} |")


if __name__ == "__main__":
    main()
