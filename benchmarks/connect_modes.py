"""The embedded cluster, reached two ways: as a Ray driver of its GCS, or over Ray Client (issue 45, item 4).

    python benchmarks/connect_modes.py              # 3 repetitions, ~3 min on 2 cores
    python benchmarks/connect_modes.py --reps 5

One embedded cluster (4 logical CPUs, its own throwaway ``NBTRAIN_HOME``, stopped at the end). Each
repetition runs both ways, interleaved (which goes first alternates), each in a fresh Python process,
as a notebook kernel is:

- **connect, cold**: the first ``nbtrain.connect(address)`` of the process (``import nbtrain`` before it
  is not counted); **warm**: ``disconnect()`` then ``connect()`` again in the same process;
- **launch → first step**: ``launch()`` of a 2-rank run (1 CPU each, 0.05 s a step, a report per step)
  to the first row's timestamp on its rank;
- **feed p50 / p95**: a row's arrival in the notebook (``run.refresh(wait_s=1)``, the dashboard's long
  poll) minus its ``report()`` on the rank, over the run's first 80 rows;
- **notebook RSS**: the kernel process's resident memory then; **session server RSS**: over Ray Client,
  the session's own server process on the head (part of the cost on a laptop, where the head is local);
- **survives a kernel restart**: the kernel exits with the run going; a new process connects the same
  way, ``attach()``es and waits: the run succeeds with every row of both ranks.

Measured 2026-11-27 on the 2-core test VM (``python benchmarks/connect_modes.py --reps 3``, medians of 3;
other engineers' work ran on the machine too, so read the ratios; an earlier run, busier, gave 0.90 /
2.53 s cold, 0.55 / 1.90 s warm, 7.2 / 7.1 s to the first step, feed p50 64 / 72 ms, the same RSS):

| figure | driver (GCS) | Ray Client |
|---|---|---|
| connect, cold (s) | 0.87 | 2.12 |
| connect, warm (s) | 0.53 | 1.93 |
| launch → first step (s) | 3.90 | 3.74 |
| feed p50 (ms) | 38 | 50 |
| feed p95 (ms) | 77 | 87 |
| notebook RSS (MB) | 165 | 157 |
| session server RSS on the head (MB) | 0 (none) | 167 |
| survives a kernel restart (every row) | yes | yes |

The driver connects 2.5-3.6x sooner and needs no session server (167 MB on a laptop's head, per
notebook); the kernel holds 8 MB more; launch, feed and restarts are the same within this machine's
noise (feed p50 ranged 35-80 ms for both across repetitions).

``local_head.NOTEBOOKS_JOIN_AS_DRIVER`` chooses the way for ``connect()`` without an address: the driver,
by these figures, and each way is reachable by the embedded cluster's other address and
tested (``tests/test_connect_driver.py::test_the_embedded_cluster_is_reached_both_ways``).
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

STEPS = 60
FEED_ROWS = 80


def _address(mode: str) -> str:
    from nbtrain._client.local import local_cluster

    info = local_cluster.status()
    assert info is not None, "the embedded cluster is not running"
    return info.gcs_address if mode == "driver" else info.address


def _feed(config: dict[str, Any]) -> None:
    import time as _time

    import nbtrain

    for step in range(config["steps"]):
        nbtrain.report(step=step, sent=_time.time())
        _time.sleep(0.05)


def _session_server_rss_mb() -> float | None:
    import psutil

    from nbtrain._client.local import local_cluster

    info = local_cluster.status()
    if info is None:
        return None
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or ()
        if "--mode=specific-server" in args and f"--address={info.gcs_address}" in args:  # it names only that
            return float(proc.memory_info().rss / 2**20)
    return None


def kernel(mode: str, name: str) -> dict[str, Any]:
    """One kernel's life: connect twice, launch, follow the feed, exit with the run going."""
    import psutil

    import nbtrain

    address = _address(mode)
    began = time.monotonic()
    nbtrain.connect(address, progress=lambda _m: None)
    cold = time.monotonic() - began
    nbtrain.disconnect()
    began = time.monotonic()
    nbtrain.connect(address, progress=lambda _m: None)
    warm = time.monotonic() - began
    launched = time.time()
    run = nbtrain.launch(_feed, workers=2, name=name, config={"steps": STEPS})
    latencies: list[float] = []
    first_sent = None
    deadline = time.monotonic() + 180
    while len(latencies) < FEED_ROWS and time.monotonic() < deadline:
        for row in run.refresh(wait_s=1.0):
            arrived = time.time()
            if "sent" in row:
                latencies.append(arrived - row["sent"])
                first_sent = row["sent"] if first_sent is None else min(first_sent, row["sent"])
    return {"connect_cold_s": cold, "connect_warm_s": warm,
            "first_step_s": (first_sent - launched) if first_sent else None,
            "feed_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
            "feed_p95_ms": 1000 * statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 2 else None,
            "notebook_rss_mb": psutil.Process().memory_info().rss / 2**20,
            "session_server_rss_mb": _session_server_rss_mb() if mode == "client" else 0.0}


def restarted(mode: str, name: str) -> dict[str, Any]:
    """A restarted kernel: connect the same way, attach, wait; is every row of both ranks there?"""
    import nbtrain

    nbtrain.connect(_address(mode), progress=lambda _m: None)
    run = nbtrain.attach(name)
    state = run.wait(timeout=300, raise_on_failure=False)
    steps = {rank: [row["step"] for row in run.metrics if row["rank"] == rank] for rank in (0, 1)}
    whole = all(found == list(range(STEPS)) for found in steps.values())
    run.delete()
    return {"survives_restart": bool(state == "succeeded" and whole)}


def _child(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{args} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return dict(json.loads(lines[-1][len("RESULT "):]))


FIGURES = [("connect, cold (s)", "connect_cold_s", "{:.2f}"), ("connect, warm (s)", "connect_warm_s", "{:.2f}"),
           ("launch → first step (s)", "first_step_s", "{:.2f}"), ("feed p50 (ms)", "feed_p50_ms", "{:.0f}"),
           ("feed p95 (ms)", "feed_p95_ms", "{:.0f}"), ("notebook RSS (MB)", "notebook_rss_mb", "{:.0f}"),
           ("session server RSS on the head (MB)", "session_server_rss_mb", "{:.0f}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kernel", choices=["driver", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--restarted", choices=["driver", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernel or args.restarted:
        result = kernel(args.kernel, args.name) if args.kernel else restarted(args.restarted, args.name)
        print("RESULT " + json.dumps(result), flush=True)
        return

    os.environ["NBTRAIN_HOME"] = str(Path(tempfile.mkdtemp(prefix="nbt-connect-", dir="/tmp")) / "home")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from nbtrain._client.local import local_cluster

    results: dict[str, list[dict[str, Any]]] = {"driver": [], "client": []}
    try:
        local_cluster.start(num_cpus=4, progress=lambda m: print(f"  [cluster] {m}", flush=True))
        for rep in range(args.reps):
            for mode in (("driver", "client") if rep % 2 == 0 else ("client", "driver")):
                name = f"connect-{mode}-{rep}"
                measured = _child("--kernel", mode, "--name", name)
                measured.update(_child("--restarted", mode, "--name", name))
                print(f"rep {rep} {mode}: {json.dumps(measured)}", flush=True)
                results[mode].append(measured)
    finally:
        local_cluster.stop()
    print("\n| figure | driver (GCS) | Ray Client |\n|---|---|---|")
    for label, key, form in FIGURES:
        cells = []
        for mode in ("driver", "client"):
            values = [r[key] for r in results[mode] if r.get(key) is not None]
            cells.append(form.format(statistics.median(values)) if values else "—")
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    survived = ["yes" if all(r["survives_restart"] for r in results[mode]) else "no" for mode in ("driver", "client")]
    print(f"| survives a kernel restart (every row) | {survived[0]} | {survived[1]} |")


if __name__ == "__main__":
    main()
