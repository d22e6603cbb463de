"""Where the cores go during an nbtrain run: CPU time per process group, steady state.

On 2 cores with 2 DDP ranks, every other process that wakes up takes time from
a rank, and a late rank stalls the other one at the next all-reduce. This
script runs the benchmark workload under ``nbtrain.launch`` (the driver
long-polls like a dashboard) and samples ``/proc`` CPU times of every process
on the machine over a 20 s window after warm-up, grouped by role::

    python benchmarks/cpu_share.py              # 2 runs of 400 steps, ~3 min

Figures are percent of one core (200 % is the whole 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _own_cluster import own_cluster

GROUPS = (  # first match wins
    ("training ranks", "TrainWorker"),
    ("run supervisor", "RunSupervisor"),
    ("Ray Client servers", "ray.util.client.server"),
    ("this driver", "cpu_share.py"),
    ("other Ray processes", "ray"),
)


def _cpu_seconds() -> dict[int, tuple[float, str]]:
    import psutil

    seen = {}
    for proc in psutil.process_iter(["pid", "cmdline", "cpu_times", "name"]):
        try:
            times = proc.info["cpu_times"]
            command = " ".join(proc.info["cmdline"] or [proc.info["name"] or ""])
            seen[proc.info["pid"]] = (times.user + times.system, command)
        except Exception:  # noqa: BLE001 - a process that ended between listing and reading
            continue
    return seen


def _group(command: str) -> str:
    return next((name for name, marker in GROUPS if marker in command), "everything else")


def share_during(window_s: float, delay_s: float) -> dict[str, dict[str, float]]:
    """Percent of one core per group, and per process, over ``window_s`` seconds from ``delay_s`` on."""
    time.sleep(delay_s)
    before, began = _cpu_seconds(), time.monotonic()
    time.sleep(window_s)
    after, elapsed = _cpu_seconds(), time.monotonic() - began
    groups: dict[str, float] = {}
    processes: dict[str, float] = {}
    for pid, (seconds, command) in after.items():
        if pid in before:
            percent = (seconds - before[pid][0]) / elapsed * 100.0
            group = _group(command)
            groups[group] = groups.get(group, 0.0) + percent
            processes[f"{pid} {command[:110]}"] = percent
    return {"groups": groups, "processes": processes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--window", type=float, default=20.0, help="seconds sampled per run")
    parser.add_argument("--delay", type=float, default=15.0, help="seconds after launch before sampling")
    parser.add_argument("--top", type=int, default=0, help="also list the N busiest processes")
    args = parser.parse_args()

    import cloudpickle
    import run_benchmarks

    import workload

    cloudpickle.register_pickle_by_value(workload)
    cloudpickle.register_pickle_by_value(run_benchmarks)
    with own_cluster("nbtrain-cpu-share-", num_cpus=4):
        for index in range(args.runs):
            shares: dict[str, Any] = {}
            sampler = threading.Thread(target=lambda found=shares: found.update(share_during(args.window, args.delay)))
            sampler.start()
            result = run_benchmarks.run_nbtrain(args.steps, 20, 900, 0.0, name=f"cpu-share-{index}-{os.getpid()}")
            sampler.join()
            print(f"run {index}: {result['samples_per_s']:.0f} samples/s, "
                  f"report → notebook p50 {result['latency_p50_ms']:.0f} ms", flush=True)
            for group, percent in sorted(shares["groups"].items(), key=lambda item: -item[1]):
                print(f"  {percent:6.1f} %  {group}", flush=True)
            busiest = sorted(shares["processes"].items(), key=lambda item: -item[1])[:args.top]
            for process, percent in busiest:
                print(f"      {percent:6.1f} %  {process}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
