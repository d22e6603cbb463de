"""The notebook's loop after a stop: stop a run, run the cell again; launch() → the re-run's first row.

    python benchmarks/rerun_after_stop.py            # ~1 min, its own loopback cluster (2 CPUs)
    python benchmarks/rerun_after_stop.py --reps 5

Each repetition launches a 2-rank DDP run (a small model, gloo) that trains until stopped, waits for five rows
from each rank, calls ``run.stop()`` (its seconds are printed too), then launches the same function again and
times ``launch()`` → its first row in the notebook, and notes whether the re-run's ranks are the stopped run's
processes (warm) or new ones (``import torch`` again). Before the cooperative stop (issue 56's cuts) a stop killed
the ranks; now every rank ends at one step and goes back to the session's warm pool.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _own_cluster import own_cluster


def train_until_stopped(config):
    import torch

    import nbtrain

    model = nbtrain.prepare_model(torch.nn.Linear(32, 1))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    step = 0
    while True:
        step += 1
        optimizer.zero_grad()
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        nbtrain.report(step=step, loss=float(loss))
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with own_cluster("nbtrain-bench-rerun-", num_cpus=2):
        import nbtrain

        stops, reruns, warm = [], [], []
        run = nbtrain.launch(train_until_stopped, workers=2, name="rerun-bench")
        for rep in range(args.reps):
            deadline = time.monotonic() + 180
            while not all(sum(r["rank"] == rank for r in run.metrics) >= 5 for rank in (0, 1)):
                run.refresh(wait_s=0.5)
                if time.monotonic() > deadline:
                    raise SystemExit("no five rows from each rank in 180 s")
            pids = {w["pid"] for w in run.workers}
            began = time.monotonic()
            run.stop()
            stops.append(time.monotonic() - began)
            began = time.monotonic()
            run = nbtrain.launch(train_until_stopped, workers=2, name=f"rerun-bench-{rep + 2}")
            while not run.refresh(wait_s=0.2) and not run.metrics:
                pass
            reruns.append(time.monotonic() - began)
            warm.append(len(pids & {w["pid"] for w in run.workers}))
            print(f"  rep {rep + 1}: stop {stops[-1]:.2f} s, re-run → first row {reruns[-1]:.2f} s, "
                  f"{warm[-1]} of 2 ranks the stopped run's processes", flush=True)
        run.stop()
        print(f"stop: median {statistics.median(stops):.2f} s; re-run after a stop → first row: median "
              f"{statistics.median(reruns):.2f} s (of {args.reps}); ranks reused: {warm}")


if __name__ == "__main__":
    main()
