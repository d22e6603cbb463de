"""How long ``nbtrain runs`` (the installed entry point) takes to answer, with its cluster up and down.

The script starts its own embedded cluster under a throwaway ``NBTRAIN_HOME``,
launches a run that finishes after 8 steps and one that keeps reporting, then
times ``nbtrain runs`` and ``nbtrain runs --json`` (each a new process, as a
user types it) ``--reps`` times. Then it stops the cluster (the live run is
lost with it) and times them again. ``nbtrain runs --live`` (the cluster's own
word) is timed too where the installed nbtrain has it. It prints one line per
call and a table of medians, and what the calls showed of the lost run (its
state and step)::

    python benchmarks/cli_runs.py              # 3 calls of each, about 2 minutes

With the cluster down, an nbtrain whose ``runs`` connects starts a new
cluster to ask; the script stops any cluster a call started, after the call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RECORDED_STEPS = 8  # the finished run reports steps 0..7


def finished(config: dict[str, Any]) -> None:
    import nbtrain

    for step in range(RECORDED_STEPS):
        nbtrain.report(step=step, loss=1.0 / (step + 1))


def going(config: dict[str, Any]) -> None:
    import time

    import nbtrain

    step = 0
    while True:
        nbtrain.report(step=step, loss=1.0)
        step += 1
        time.sleep(0.2)


def entry_point() -> str:
    """The ``nbtrain`` script of this Python's installation (not a shim in front of it)."""
    script = Path(sys.executable).parent / "nbtrain"
    if not script.exists():
        msg = f"No nbtrain entry point next to {sys.executable}; install nbtrain (pip install -e .) first."
        raise SystemExit(msg)
    return str(script)


def timed(argv: list[str], timeout: float) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          check=False)
    return time.perf_counter() - began, done


def lost_run_shown(mode: str, output: str, name: str) -> str:
    """What a call's output said of run ``name``: its state and step."""
    if mode == "--json":
        try:
            run = next(r for r in json.loads(output)["runs"] if r["name"] == name)
        except (ValueError, KeyError, StopIteration):
            return "not listed"
        return f"{run['state']} step {(run.get('progress') or {}).get('step')}"
    line = next((line for line in output.splitlines() if line.split()[:1] == [name]), None)
    return " ".join(line.split()[1:6]) if line else "not listed"  # state, attempt N, step N


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="calls of each command in each case (3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one call may take (300)")
    args = parser.parse_args()

    os.environ["NBTRAIN_HOME"] = str(Path(tempfile.mkdtemp(prefix="nbtrain-cli-runs-")) / "home")
    os.environ.pop("RAY_ADDRESS", None)
    import nbtrain  # after NBTRAIN_HOME is set
    from nbtrain._client.local import local_cluster

    nbtrain_cmd = entry_point()
    has_live = "--live" in subprocess.run([nbtrain_cmd, "runs", "--help"], capture_output=True, text=True,
                                          check=False).stdout
    modes = ["", "--json"] + (["--live"] if has_live else [])
    print(f"nbtrain {nbtrain.__version__} from {Path(nbtrain.__file__).parent}; entry point {nbtrain_cmd}; "
          f"home {os.environ['NBTRAIN_HOME']}", flush=True)
    figures: dict[tuple[str, str], list[float]] = {}
    shown: dict[tuple[str, str], str] = {}
    try:
        nbtrain.connect(num_cpus=2, progress=lambda message: print(f"  [cluster] {message}", flush=True))
        nbtrain.launch(finished, workers=1, name="finished-run", warm=False).wait(timeout=180)
        lost = nbtrain.launch(going, workers=1, name="live-run", warm=False)
        while len({row["step"] for row in lost.metrics}) < RECORDED_STEPS:
            lost.refresh(wait_s=1.0)
        nbtrain.disconnect()
        for case in ("up", "down"):
            if case == "down":
                local_cluster.stop()
                print("cluster stopped; live-run is lost with it", flush=True)
            for _ in range(args.reps):
                for mode in modes:
                    seconds, done = timed([nbtrain_cmd, "runs", *filter(None, [mode])], args.timeout)
                    started = case == "down" and local_cluster.status() is not None
                    if started:
                        local_cluster.stop()
                    label = f"nbtrain runs {mode}".strip()
                    figures.setdefault((case, label), []).append(seconds)
                    shown[(case, label)] = lost_run_shown(mode, done.stdout, "live-run")
                    print(f"cluster {case:4s} {label:20s} {seconds:6.2f} s  exit {done.returncode}"
                          f"{'  (started a cluster to ask)' if started else ''}; live-run: {shown[(case, label)]}",
                          flush=True)
                    if done.returncode != 0:
                        print(done.stderr[-2000:], flush=True)
    finally:
        nbtrain.disconnect()
        local_cluster.stop()
    print("\n| cluster | command | median (s) | min–max (s) | live-run shown as |\n|---|---|---|---|---|")
    for (case, label), seconds in figures.items():
        print(f"| {case} | `{label}` | {statistics.median(seconds):.2f} | {min(seconds):.2f}–{max(seconds):.2f} "
              f"| {shown[(case, label)]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
