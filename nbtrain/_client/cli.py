"""The ``nbtrain`` command: the embedded local cluster, runs, and the lab entry point.

    nbtrain cluster start [--num-cpus N] [--num-gpus N]   start (or reuse) the loopback cluster
    nbtrain cluster stop                                  stop it (only it: never a bare `ray stop`)
    nbtrain cluster status                                is it running, at which address
    nbtrain runs [--json] [--address ADDR]               runs on the cluster (what the lab sidebar shows)
    nbtrain stop NAME [--address ADDR]                    stop a run
    nbtrain lab [NOTEBOOK]                                local cluster + JupyterLab on 127.0.0.1
    nbtrain agent                                         the above as JSON lines on stdin (for the lab server)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain import _json
from nbtrain._client import local_cluster

if TYPE_CHECKING:
    from nbtrain._client.connection import Cluster
    from nbtrain._registry import ClusterRecord, RunRecord


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _connect(address: str | None) -> Cluster:
    """Connect as a reader: the sidebar's cluster line stays the one a notebook connected to."""
    from nbtrain._client.connection import open_session

    return open_session(address, progress=lambda _m: None)


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.action == "start":
        info = local_cluster.start(num_cpus=args.num_cpus, num_gpus=args.num_gpus, progress=_say)
        print(info.address)
        return 0
    if args.action == "stop":
        stopped = local_cluster.stop()
        _say("Local Ray cluster stopped." if stopped else "No local Ray cluster was running.")
        return 0
    running = local_cluster.status()
    if running is None:
        print("stopped")
        return 1
    print(f"running at {running.address} (pid {running.pid}, {running.num_cpus} CPUs)")
    return 0


def _address_for(name: str | None, given: str | None) -> str | None:
    if given:
        return given
    if name:
        from nbtrain._registry import read_run

        record = read_run(name)
        if record and record.get("address"):
            local = local_cluster.status()
            if local is None or record["address"] != local.address:
                return record["address"]
    return os.environ.get("RAY_ADDRESS") or None


def cmd_runs(args: argparse.Namespace) -> int:
    answer = cluster_answer(_connect(_address_for(None, args.address)))
    if args.json:
        print(_json.dumps(answer))
        return 0
    for run in answer["runs"]:
        progress = run.get("progress") or {}
        print(f"{run['name']:<32} {run['state']:<11} attempt {run.get('attempt')} step {progress.get('step')}")
    return 0


def cluster_answer(cluster: Cluster) -> dict[str, Any]:
    """What ``nbtrain runs --json`` prints, and the lab server serves: the cluster and every run on it,
    as registry records (:mod:`nbtrain._registry`). It only reads: no file is written.

    ``{"address": A, "cluster": ClusterRecord, "runs": [RunRecord, ...]}``. A run whose supervisor
    does not answer (restarting) is left out: readers keep what they knew of it.
    """
    from nbtrain._client.launch import run_summaries
    from nbtrain._registry import record_from_summary

    alive = [node for node in cluster.nodes() if node["alive"]]
    record: ClusterRecord = {
        "address": cluster.address, "kind": cluster.kind, "nodes": len(alive),
        "resources": {key: list(pair) for key, pair in cluster.resources().items() if key in ("CPU", "GPU")},
        "updated": time.time(),
    }
    runs: list[RunRecord] = [record_from_summary(summary, cluster.address) for summary in run_summaries()
                             if summary["state"] != "unknown"]
    return {"address": cluster.address, "cluster": record, "runs": runs}


def cmd_stop(args: argparse.Namespace) -> int:
    import nbtrain

    _connect(_address_for(args.name, args.address))
    run = nbtrain.attach(args.name)
    state = run.stop()
    print(f"Run {args.name!r} {state.value}.")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    info = local_cluster.start(progress=_say)
    env = {**os.environ, "RAY_ADDRESS": info.address}
    notebook = args.notebook or _default_notebook()
    command = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1"]
    if notebook:
        command.append(str(notebook))
    command += args.jupyter_args
    _say(f"JupyterLab on 127.0.0.1 with the local Ray cluster at {info.address}")
    return subprocess.call(command, env=env)


def cmd_agent(args: argparse.Namespace) -> int:
    from nbtrain._client.agent import serve

    return serve(sys.stdin)


def _default_notebook() -> Path | None:
    candidate = Path.cwd() / "notebooks" / "01_quickstart.ipynb"
    return candidate if candidate.exists() else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nbtrain", description="Distributed PyTorch training on Ray, from notebooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    cluster = sub.add_parser("cluster", help="the embedded local Ray cluster (127.0.0.1 only, token auth)")
    cluster.add_argument("action", choices=("start", "stop", "status"))
    cluster.add_argument("--num-cpus", type=int, default=None)
    cluster.add_argument("--num-gpus", type=int, default=None)
    cluster.set_defaults(func=cmd_cluster)
    runs = sub.add_parser("runs", help="list runs on the cluster")
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--address", default=None)
    runs.set_defaults(func=cmd_runs)
    stop = sub.add_parser("stop", help="stop a run")
    stop.add_argument("name")
    stop.add_argument("--address", default=None)
    stop.set_defaults(func=cmd_stop)
    lab = sub.add_parser("lab", help="start the local cluster and JupyterLab")
    lab.add_argument("notebook", nargs="?", default=None)
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER)
    lab.set_defaults(func=cmd_lab)
    agent = sub.add_parser("agent", help="answer commands from stdin, one JSON list per line (used by the lab sidebar)")
    agent.set_defaults(func=cmd_agent)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from nbtrain._exceptions import NbtrainError

    try:
        return int(args.func(args))
    except NbtrainError as exc:
        print(f"nbtrain: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
