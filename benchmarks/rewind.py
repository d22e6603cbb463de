"""What going back costs: ``run.rewind()`` in place against what a fork must do, for a model of ~1 GB of state.

    python benchmarks/rewind.py              # ~1 min, no cluster
    python benchmarks/rewind.py --mb 128     # a smaller model
    python benchmarks/rewind.py --cluster    # and the same run rewound, then forked, on a loopback cluster (~2 min)

A model of linear layers (2048 x 2048 float32, with biases; 16 MB each) with ``--mb`` MB of parameters, and
SGD with momentum, whose buffers are as large: the default 512 MB of parameters is ~1 GB of state to restore.

1. **In place** (what ``run.rewind()`` does on each rank; no cluster): the restore point taken at a checkpoint
   (a copy of the model's and optimizer's state on the CPU, :mod:`nbtrain._cluster.rank.rewinding`), then the
   restore into the same model and optimizer, RNG and LR schedule included. Best of 3.
2. **What a fork does at the least** (no cluster, so a lower bound of ``run.fork()``): a new Python process
   that imports torch, builds the model and optimizer, ``torch.load``\\ s the checkpoint file the run saved
   (written here first with ``torch.save``, as ``save_checkpoint`` writes it) and loads it into them. A real
   fork also places workers with Ray, starts the process group and, for a compiled model, compiles again.
3. **On a cluster** (``--cluster``, its own loopback cluster): one real 2-rank run (DDP, gloo) of ``--cluster-mb``
   MB of parameters, a checkpoint every 20 steps, rewound in place with ``run.rewind(step=45)``, then forked with
   ``run.fork()`` from its latest checkpoint. Each: from the call until every rank has reported the first step of
   the new branch (the fork: of the new run), as the notebook sees it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

WIDTH = 2048
LAYER_MB = (WIDTH * WIDTH + WIDTH) * 4 / 2**20

CHILD = """
import sys, time
import torch
began = float(sys.argv[3])
torch.set_num_threads(1)
layers = int(sys.argv[2])
model = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range(layers)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
saved = torch.load(sys.argv[1], weights_only=True)
model.load_state_dict(saved["model"])
optimizer.load_state_dict(saved["optimizer"])
print(time.time() - began)
"""


def _model(layers: int) -> tuple[Any, Any]:
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(8, WIDTH)).sum().backward()
    optimizer.step()  # the momentum buffers exist: the optimizer's state is as large as the model's
    return model, optimizer


def in_place(layers: int) -> tuple[float, float]:
    """Seconds to take a restore point and to restore it, on one rank's session as a run has it."""
    from nbtrain._cluster.rank.rank_steering import RankSteering
    from nbtrain._cluster.rank.reporting import Reporter

    session = SimpleNamespace(supervisor=None, context=SimpleNamespace(rank=0), uses_loader=True, reporter=Reporter(),
                              report_calls=0, last_step=0, step=0, epoch=0, commands_due=lambda due: None, timing=None)
    session.current_step = lambda: 100
    steering = RankSteering(session, [])
    model, optimizer = _model(layers)
    try:
        steering.steer(optimizer)
        steering.points.models.append(model)
        began = time.perf_counter()
        steering.saved_checkpoint()
        captured = time.perf_counter() - began
        began = time.perf_counter()
        steering.points.restore(100, skip=0)
        restored = time.perf_counter() - began
    finally:
        steering.unhook()
    return captured, restored


def fork_floor(layers: int) -> tuple[float, float]:
    """Seconds to save the checkpoint file, and for a new process to load it into a new model and optimizer."""
    import torch

    model, optimizer = _model(layers)
    with tempfile.TemporaryDirectory(prefix="nbtrain-rewind-bench-") as directory:
        path = os.path.join(directory, "checkpoint.pt")
        began = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        saved = time.perf_counter() - began
        del model, optimizer
        began = time.time()
        out = subprocess.run([sys.executable, "-c", CHILD.format(width=WIDTH), path, str(layers), str(began)],
                             check=True, capture_output=True, text=True)
        return saved, float(out.stdout.strip().splitlines()[-1])


def cluster_loop(config: dict[str, Any]) -> None:
    """The run: ``layers`` linear layers, SGD with momentum, a checkpoint every 20 steps (a fork loads it)."""
    import torch

    import nbtrain

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(config["layers"])])
    saved = nbtrain.load_checkpoint()
    if saved:
        net.load_state_dict(saved["model"])
    model = nbtrain.prepare_model(net)
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9))
    if saved:
        optimizer.load_state_dict(saved["optimizer"])
    x = torch.randn(8 * 2 * config["steps"], WIDTH)
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8))
    for (xb,) in loader:
        optimizer.zero_grad()
        loss = model(xb).pow(2).mean()
        loss.backward()
        optimizer.step()
        nbtrain.report(loss=loss.item())
        if nbtrain.get_context().step % 20 == 0:
            nbtrain.save_checkpoint({"model": net.state_dict(), "optimizer": optimizer.state_dict()})


def _first_rows_after(run: Any, began: float, since: dict[int, float] | None = None) -> float:
    """Seconds from ``began`` until each of the 2 ranks reported a row after it (after ``since[rank]``, by the rank's
    clock, where given: when it went back)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        run.refresh(wait_s=1.0)
        run.raise_if_failed()
        firsts: dict[int, float] = {}
        for row in run.metrics:
            if row["time"] > max(began, (since or {}).get(row["rank"], began)):
                firsts[row["rank"]] = min(firsts.get(row["rank"], row["time"]), row["time"])
        if len(firsts) == 2:
            return max(firsts.values()) - began
    raise TimeoutError("no first rows after 600 s")


def on_cluster(mb: float) -> tuple[float, float, float]:
    """(rewind s, fork s, state MB) on one real run of the benchmark's own loopback cluster."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import nbtrain

    from _own_cluster import own_cluster

    layers = max(1, round(mb / LAYER_MB))
    with own_cluster("nbtrain-rewind-", num_cpus=4):
        run = nbtrain.launch(cluster_loop, workers=2, name="rewound", config={"layers": layers, "steps": 400})
        child = None
        try:
            while (run.summary().get("step") or 0) < 50:
                run.refresh(wait_s=1.0)
                run.raise_if_failed()
            began = time.time()
            run.rewind(step=45, wait=True)
            went = run.rewinds[-1]
            rewound = _first_rows_after(run, began, since=went["rank_times"])  # rows after each rank went back
            print(f"  rewound to step {went['to_step']} from step {went['step']}: {rewound:.2f} s", flush=True)
            began = time.time()
            child = run.fork(name="forked")
            forked = _first_rows_after(child, began)
            print(f"  forked at step {child.summary()['parent']['step']}: {forked:.2f} s", flush=True)
        finally:
            for each in (run, child):
                if each is not None and not each.state.is_terminal:
                    each.stop()
    return rewound, forked, 2 * layers * LAYER_MB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=512.0, help="MB of parameters (the state is twice that)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cluster", action="store_true", help="also rewind and fork one run on a loopback cluster")
    parser.add_argument("--cluster-mb", type=float, default=64.0, help="MB of parameters of that run (64)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch

    torch.set_num_threads(1)
    layers = max(1, round(args.mb / LAYER_MB))
    state_mb = 2 * layers * LAYER_MB
    captures, restores, saves, forks = [], [], [], []
    for _ in range(args.reps):
        captured, restored = in_place(layers)
        saved, forked = fork_floor(layers)
        captures.append(captured)
        restores.append(restored)
        saves.append(saved)
        forks.append(forked)
    print(f"model: {layers} x Linear({WIDTH}, {WIDTH}), {state_mb:.0f} MB of state (parameters + SGD momentum), "
          f"best of {args.reps}, 1 thread")
    print(f"| in place: restore point taken at save_checkpoint | {min(captures):.2f} s |")
    print(f"| in place: run.rewind() restore on the rank | {min(restores):.2f} s |")
    print(f"| fork floor: torch.save of the checkpoint | {min(saves):.2f} s |")
    print(f"| fork floor: new process, import torch, build, torch.load, load_state_dict | {min(forks):.2f} s |")
    if args.cluster:
        rewound, forked, state_mb = on_cluster(args.cluster_mb)
        print(f"\nthe same 2-rank run on a loopback cluster, {state_mb:.0f} MB of state per rank: call -> every rank's "
              "first step of the new branch (the fork: of the new run)")
        print(f"| run.rewind(step=45), in place | {rewound:.2f} s |")
        print(f"| run.fork() from its latest checkpoint | {forked:.2f} s |")
        print(f"| ratio | fork {forked / rewound:.1f}x the rewind |")


if __name__ == "__main__":
    main()
