"""What one long poll over Ray Client costs in CPU, and where: notebook, proxy, session server, actor.

On a laptop every millisecond of CPU the notebook's polling takes is a
millisecond the DDP ranks wait for a core. This script starts its own embedded
cluster, creates an actor whose ``poll`` answers after ``--wait`` seconds with a
dashboard-sized reply, polls it ``--polls`` times with ``ray.get`` and then with
``ref.future()`` (what ``Run.refresh`` uses), and prints the CPU each process
spent per poll (including its idle ticking over the poll's duration)::

    python benchmarks/poll_cost.py              # 2 rounds of 60 polls each way, ~2 min
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _own_cluster import own_cluster

ROLES = (  # first match wins
    ("proxy", "--mode=proxy"), ("session server", "ray.util.client.server"), ("actor", "ray::Poller"),
    ("GCS", "gcs_server"), ("raylet", "raylet/raylet"),
)


class Poller:
    def poll(self, wait_s: float) -> dict[str, Any]:
        time.sleep(wait_s)
        now = time.time()
        return {"rows": [{"rank": rank, "step": 1, "loss": 0.5, "t": now} for rank in range(2)], "now": now,
                "workers": [{"rank": rank, "state": "running", "pid": 1} for rank in range(2)]}


def _processes() -> dict[int, tuple[str, Any]]:
    import psutil

    found = {os.getpid(): ("notebook (this driver)", psutil.Process())}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(proc.info["cmdline"] or [])
        role = next((name for name, marker in ROLES if marker in command), None)
        if role:
            found[proc.info["pid"]] = (role, proc)
    return found


def _cpu_by_role(processes: dict[int, tuple[str, Any]]) -> dict[str, float]:
    import psutil

    seconds: dict[str, float] = {}
    for role, proc in processes.values():
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        seconds[role] = seconds.get(role, 0.0) + times.user + times.system
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=60)
    parser.add_argument("--wait", type=float, default=0.2, help="seconds each poll waits at the actor")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    with own_cluster("nbtrain-poll-cost-", num_cpus=2):
        import ray

        poller = ray.remote(Poller).options(max_concurrency=8).remote()
        ray.get(poller.poll.remote(0.0))
        processes = _processes()
        for _ in range(args.rounds):
            for how in ("ray.get", "future"):
                before, began = _cpu_by_role(processes), time.monotonic()
                for _ in range(args.polls):
                    ref = poller.poll.remote(args.wait)
                    if how == "ray.get":
                        ray.get(ref, timeout=30)
                    else:
                        ref.future().result(timeout=30)
                after, elapsed = _cpu_by_role(processes), time.monotonic() - began
                per_poll = {role: (after[role] - before.get(role, 0.0)) / args.polls * 1000 for role in after}
                parts = ", ".join(f"{role} {ms:.1f}" for role, ms in sorted(per_poll.items()))
                print(f"{how:8s} {elapsed / args.polls * 1000:4.0f} ms per poll; CPU ms per poll: {parts}; "
                      f"total {sum(per_poll.values()):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
