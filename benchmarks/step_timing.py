"""What splitting each step's time costs (data wait, compute, gradient communication; ``step_timing``)::

    python benchmarks/step_timing.py              # ~5 min on the 2-core VM
    python benchmarks/step_timing.py --rounds 3 --steps 150 --out benchmarks/results/step_timing.json

The benchmark's CNN (``workload.py``, the same function as ``elastic.py``'s gradient-noise cost)
on 2 DDP ranks of this script's own loopback cluster, with ``step_timing=False`` and ``True``
alternating, the order switched each round. Each run reports every step's wall time and the rank
process's CPU time (every thread: the heartbeat's work included); the figures are the medians over
rounds of each run's median after ``WARMUP`` steps, and the cost is ``with / without - 1``, also as
the median of the per-round pairs (in the JSON). On a machine others share, the CPU time is the
steadier figure: wall time moves with their load. What is timed, per step: two clock
reads around the prepared loader's next batch, and a Python DDP communication hook (the default
all-reduce, with a clock read as each bucket is handed over and as it completes) in place of
DDP's built-in one; the heartbeat's once-a-second averages are off the step's path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import elastic  # noqa: E402  (its cnn_fn is shipped to the workers by value)
from run_benchmarks import write_json  # noqa: E402

import workload  # noqa: E402
from _own_cluster import own_cluster  # noqa: E402

WARMUP = 20


def one_run(timed: bool, steps: int, index: int) -> tuple[float, float]:
    import nbtrain

    run = nbtrain.launch(elastic.cnn_fn, config={"steps": steps}, workers=2, step_timing=timed,
                         name=f"bench-step-timing-{index}-{'on' if timed else 'off'}")
    run.wait(timeout=600, raise_on_failure=True)
    if timed:
        split = {w["rank"]: {k: round(w.get(k) or 0.0, 1) for k in ("data_ms", "compute_ms", "comm_ms")}
                 for w in run.workers}
        print(f"  split per rank (ms per step): {split}", flush=True)
    steady = [r for r in run.metrics if r["step"] > WARMUP]
    return statistics.median(r["step_s"] for r in steady), statistics.median(r["cpu_s"] for r in steady)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "step_timing.json")
    args = parser.parse_args()
    import cloudpickle

    cloudpickle.register_pickle_by_value(workload)  # nbtrain workers cannot import benchmarks/
    cloudpickle.register_pickle_by_value(elastic)
    medians: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    with own_cluster("nbtrain-bench-step-timing-", num_cpus=3):
        one_run(True, 30, -1)  # warm: the first launch starts the workers' processes
        for index in range(args.rounds):
            for timed in ((False, True) if index % 2 == 0 else (True, False)):
                wall, used = one_run(timed, args.steps, index)
                medians[timed].append(wall)
                cpu[timed].append(used)
                print(f"round {index}: step_timing={timed}: {wall * 1000:.2f} ms, CPU {used * 1000:.2f} ms",
                      flush=True)
    results: dict[str, Any] = {"rounds_wall_s": {str(k): v for k, v in medians.items()},
                               "rounds_cpu_s": {str(k): v for k, v in cpu.items()}}
    for label, series in (("wall", medians), ("cpu", cpu)):
        off, on = statistics.median(series[False]), statistics.median(series[True])
        paired = statistics.median(b / a - 1 for a, b in zip(series[False], series[True]))
        results[label] = {"without_s": off, "with_s": on, "cost_fraction": on / off - 1, "paired_cost_fraction": paired}
        print(f"step {label} time: {off * 1000:.2f} ms without step_timing, {on * 1000:.2f} ms with "
              f"({on / off - 1:+.2%}; median of per-round pairs {paired:+.2%})")
    write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
