"""The ``nbtrain`` command: the embedded local cluster, runs, and the lab entry point.

    nbtrain cluster start [--num-cpus N] [--num-gpus N]   start (or reuse) the loopback cluster
    nbtrain cluster stop                                  stop it (only it: never a bare `ray stop`)
    nbtrain cluster status                                is it running, at which address, its added nodes
    nbtrain cluster add-node [--num-cpus N] [--num-gpus N] a second Ray node on this machine (multi-node, on loopback)
    nbtrain cluster remove-node [--pid PID]               end an added node (the newest), as a lost node would end
    nbtrain runs [--json]                                 runs this home knows, from their files (cluster up or down)
    nbtrain runs --live [--json] [--address ADDR]         runs and sweeps as the cluster reports them (the agent's)
    nbtrain stop NAME [--address ADDR]                    stop a run
    nbtrain pause NAME [--address ADDR]                   hold a run's ranks at the same step; resume NAME goes on
    nbtrain lab [NOTEBOOK] [JUPYTER OPTIONS]              JupyterLab on 127.0.0.1 + the local cluster
    nbtrain agent                                         the above as JSON lines on stdin (for the lab server)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain import _json
from nbtrain._client.local import added_nodes, local_cluster, local_nodes
from nbtrain._exceptions import InvalidOptionError, NbtrainError
from nbtrain._states import TERMINAL_STATE_NAMES

if TYPE_CHECKING:
    from nbtrain._client.connecting.connection import Cluster
    from nbtrain._client.run.handle import Run
    from nbtrain._registry import ClusterRecord, RunRecord


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _connect(address: str | None) -> Cluster:
    """Connect as a reader: the sidebar's cluster line stays the one a notebook connected to."""
    from nbtrain._client.connecting.connection import open_session

    return open_session(address, progress=lambda _m: None)


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.action == "start":
        info = local_cluster.start(num_cpus=args.num_cpus, num_gpus=args.num_gpus, progress=_say)
        print(info.connect_address)
        return 0
    if args.action == "stop":
        stopped = local_cluster.stop()
        _say("Local Ray cluster stopped." if stopped else "No local Ray cluster was running.")
        return 0
    if args.action == "add-node":
        node = local_nodes.add(args.num_cpus if args.num_cpus is not None else 1, args.num_gpus, progress=_say)
        print(node.pid)
        return 0
    if args.action == "remove-node":
        removed = local_nodes.remove(args.pid)
        if removed is None:
            _say("No added node to remove" + (f" with pid {args.pid}." if args.pid else ".") +
                 " `nbtrain cluster status` lists the added nodes.")
            return 1
        _say(f"Node {removed.pid} ({removed.num_cpus} CPUs) removed; runs with ranks on it restart or shrink.")
        return 0
    running = local_cluster.status()
    if running is None:
        print("stopped")
        return 1
    print(f"running at {running.connect_address} (Ray Client: {running.address}) "
          f"(pid {running.pid}, {running.num_cpus} CPUs)")
    for node in added_nodes.nodes():
        gpus = f", {node.num_gpus} GPUs" if node.num_gpus else ""
        print(f"  added node: pid {node.pid}, {node.num_cpus} CPUs{gpus}")
    from nbtrain._client.local import warm_processes

    print(f"  {warm_processes.describe(warm_processes.warm_processes(running.pid))}")
    return 0


def _address_for(name: str | None, given: str | None) -> str | None:
    """``--address``, else the cluster the run's registry record names, else ``$RAY_ADDRESS``."""
    if given:
        return given
    if name:
        from nbtrain._registry import read_run

        record = read_run(name)
        if record and isinstance(record.get("address"), str) and record["address"]:
            return record["address"]
    return os.environ.get("RAY_ADDRESS") or None


def cmd_runs(args: argparse.Namespace) -> int:
    """From this home's files (:mod:`nbtrain._client.run_index`), without connecting; ``--live`` (or a cluster
    named with ``--address``) asks the cluster, as the lab's agent does."""
    if args.live or args.address:
        address = _address_for(None, args.address)
        if address is None and local_cluster.status() is None:  # connecting would start one only to ask it
            msg = ("nbtrain runs --live: no cluster is up to ask (the embedded local cluster is not running and "
                   "neither --address nor $RAY_ADDRESS names another). `nbtrain runs` lists the runs from their "
                   "files; `nbtrain cluster start` starts the local cluster.")
            raise NbtrainError(msg)
        answer = cluster_answer(_connect(address))
    else:
        from nbtrain._client.run_index import index_answer

        answer = index_answer()
    if args.json:
        print(_json.dumps(answer))
        return 0
    if answer.get("source") == "files":
        _print_files_header(answer)
    clusters = answer.get("clusters", {})
    for run in answer["runs"]:
        progress = run.get("progress") or {}
        line = f"{run['name']:<32} {run['state']:<11} attempt {run.get('attempt')} step {progress.get('step')}"
        print(line + _row_source(run, clusters.get(run.get("address"), {})))
    for sweep in answer.get("sweeps", []):
        best = "" if sweep["best"] is None else f", best {sweep['metric']} {sweep['best']:.4g}"
        print(f"sweep {sweep['name']:<26} {sweep['state']:<11} {len(sweep['trials'])} trials{best}")
    return 0


def _print_files_header(answer: dict[str, Any]) -> None:
    from nbtrain._paths import nbtrain_home

    cluster = answer.get("cluster")
    where = ("no cluster running or connected to yet" if cluster is None else
             f"cluster {cluster['address']} ({cluster.get('kind') or 'remote'}) "
             + ("up" if cluster["up"] else "down: its runs that were going are lost with it"))
    print(f"Runs of {nbtrain_home()}, from their files; {where}. "
          "`nbtrain runs --live` asks the cluster (workers, pauses, sweeps).")


def _row_source(run: dict[str, Any], cluster: dict[str, Any]) -> str:
    """Where a row's state and step come from, when it is not the cluster's answer of now."""
    source = run.get("source")
    if source == "files":
        ended = run.get("state") in TERMINAL_STATE_NAMES
        error = run.get("error") if run.get("state") == "failed" else None
        why = f": {error if len(error) <= 100 else error[:99] + '…'}" if error else ""
        return "  files" + ("" if ended else f", as of {_clock(run.get('updated'))}") + why
    if source == "launch record":
        down = "; its cluster is down" if cluster.get("up") is False else ""
        return f"  as launched {_clock(run.get('created'))} (its files are on its cluster's head){down}"
    return ""


def _clock(when: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"


def cluster_answer(cluster: Cluster) -> dict[str, Any]:
    """What ``nbtrain runs --live --json`` prints, and the lab server serves: the cluster, every run on it
    as registry records (:mod:`nbtrain._registry`), and every sweep with its trials. It only reads:
    no file is written.

    ``{"address": A, "cluster": ClusterRecord, "runs": [RunRecord, ...], "sweeps": [sweep, ...], "source": "cluster"}``
    (a sweep as :func:`sweep_records` gives it). A run whose supervisor does not answer (restarting)
    is left out: readers keep what they knew of it. ``sweeps`` is left out when they could not be
    read: readers keep what they knew of them too.
    """
    from nbtrain._client.entry.launch import run_summaries
    from nbtrain._options import NAME_PATTERN
    from nbtrain._registry import record_from_summary

    alive = [node for node in cluster.nodes() if node["alive"]]
    record: ClusterRecord = {
        "address": cluster.address, "kind": cluster.kind, "nodes": len(alive),
        "resources": {key: list(pair) for key, pair in cluster.resources().items() if key in ("CPU", "GPU")},
        "warm": _warm_summary(), "updated": time.time(),
    }
    runs: list[RunRecord] = []
    for summary in run_summaries():
        if summary["state"] == "unknown":
            continue
        if not isinstance(summary.get("name"), str) or not NAME_PATTERN.match(summary["name"]):
            # The sidebar turns names into `%ray_attach NAME` cells: only names nbtrain itself allows.
            _say(f"nbtrain runs: skipped a run named {str(summary.get('name'))[:120]!r} on {cluster.address}: "
                 "not a run name (letters, digits, '_', '.', '-').")
            continue
        runs.append(record_from_summary(summary, cluster.address))
    answer: dict[str, Any] = {"address": cluster.address, "cluster": record, "runs": runs, "source": "cluster"}
    sweeps = sweep_records(cluster.address)
    if sweeps is not None:
        answer["sweeps"] = sweeps
    return answer


# What the sidebar shows of a trial (its curve stays with the sweep's dashboard).
TRIAL_FIELDS = ("index", "state", "config", "iterations", "last", "best", "stop_reason", "error", "waiting_for",
                "run")


def sweep_records(address: str) -> list[dict[str, Any]] | None:
    """Every sweep on the connected cluster (``nbtrain.sweeps()``) with its trials, or None (and a line
    on stderr) when they cannot be read.

    ``{"name", "state", "metric", "mode", "scheduler", "best", "started", "ended", "error",
    "trials": [{"index", "state", "config", "iterations", "last", "best", "stop_reason", "error",
    "waiting_for", "run"}, ...]}``; ``run`` is the trial's run name (None until it started).
    """
    from nbtrain._client.entry.sweep import attach_sweep, sweeps

    try:
        listed = sweeps()
    except Exception as exc:  # noqa: BLE001 - no Ray Tune there, an older nbtrain: the runs are still listed
        _say(f"nbtrain runs: could not list the sweeps on {address}: {type(exc).__name__}: {exc}")
        return None
    records = []
    for summary in listed:
        # One table for the whole record (sweeps() read an older one): state, best and trials agree.
        try:
            sweep = attach_sweep(summary["name"])
            best = sweep.best
        except NbtrainError:
            continue  # gone since it was listed
        table = sweep.cached
        records.append({
            "name": summary["name"], "best": None if best is None else best.best,
            **{key: table.get(key) for key in ("state", "metric", "mode", "scheduler", "started", "ended", "error")},
            "trials": [{key: trial.get(key) for key in TRIAL_FIELDS} for trial in table.get("trials", [])],
        })
    return records


def _warm_summary() -> dict[str, Any]:
    """Warm workers of every notebook session on the cluster: how many idle, in runs, and the next to exit."""
    from nbtrain._client.warm import warm_pools

    workers = [worker for pool in warm_pools().values() for worker in pool]
    idle = [worker["expires_in_s"] for worker in workers if worker["state"] == "idle"]
    return {"idle": len(idle), "busy": len(workers) - len(idle), "next_exit_s": min(idle) if idle else None}


def _attached(args: argparse.Namespace, verb: str) -> Run:
    from nbtrain._client.entry.launch import attach

    address = _address_for(args.name, args.address)
    if address is None:  # connecting without one would start a local cluster, where the run is not
        msg = (f"The registry does not say which cluster runs {args.name!r}; "
               f"give it: nbtrain {verb} {args.name} --address ray://HOST:10001 (or HOST:6379, or auto, on a "
               f"node of the cluster; or set $RAY_ADDRESS).")
        raise NbtrainError(msg)
    _connect(address)
    return attach(args.name)


def cmd_stop(args: argparse.Namespace) -> int:
    state = _attached(args, "stop").stop()
    print(f"Run {args.name!r} {state.value}.")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    step = _attached(args, "pause").pause()
    print(f"Run {args.name!r} pauses at step {step}." if step is not None else
          f"Run {args.name!r} pauses as its ranks come back.")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    _attached(args, "resume").resume()
    print(f"Run {args.name!r} resumed.")
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    """JupyterLab on 127.0.0.1, its kernels pointed at a cluster: ``$RAY_ADDRESS`` when set, else the
    embedded local cluster (started or reused). Every argument after ``lab`` goes to Jupyter as is."""
    ip, jupyter_args = jupyter_ip(list(args.jupyter_args))  # read before the cluster starts: a flag given once
    if ip != "127.0.0.1":
        _say(f"JupyterLab listens on {ip}, as --ip asked: anyone who reaches that address and has the token "
             "can run code here.")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        _say(f"JupyterLab on {ip}; notebooks connect to $RAY_ADDRESS={address} (no local cluster started)")
    else:
        address = local_cluster.start(progress=_say).connect_address
        _say(f"JupyterLab on {ip} with the local Ray cluster at {address}")
    command = [sys.executable, "-m", "jupyterlab", f"--ip={ip}", *jupyter_args]
    if not _names_a_path(jupyter_args) and (notebook := _default_notebook()) is not None:
        command.append(str(notebook))
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in jupyter_args:
        # Docker containers and most cloud GPU VMs log in as root; Jupyter refuses to start there without it.
        _say("Running as root: JupyterLab is started with --allow-root.")
        command.append("--allow-root")
    return _run_forwarding_signals(command, {**os.environ, "RAY_ADDRESS": address})


_IP_FLAGS = ("--ip", "--ServerApp.ip", "--NotebookApp.ip")


def jupyter_ip(jupyter_args: list[str]) -> tuple[str, list[str]]:
    """The address JupyterLab listens on (the user's ``--ip``, else 127.0.0.1), and the other arguments: Jupyter
    refuses an ``--ip`` given twice ("only accepts one value"), so nbtrain passes the one it was given."""
    ip, rest = "127.0.0.1", []
    arguments = iter(jupyter_args)
    for argument in arguments:
        flag, equals, value = argument.partition("=")
        if flag not in _IP_FLAGS:
            rest.append(argument)
            continue
        if not equals:
            value = next(arguments, "")
        if not value or value.startswith("-"):
            msg = f"nbtrain lab: {flag} needs an address, e.g. {flag}=127.0.0.1 (the default)."
            raise InvalidOptionError(msg)
        ip = value
    return ip, rest


def _names_a_path(jupyter_args: list[str]) -> bool:
    """Whether the user gave Jupyter a notebook or folder to open (then no default notebook is added)."""
    return any(not arg.startswith("-") and (arg.endswith(".ipynb") or Path(arg).exists()) for arg in jupyter_args)


_FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
_SHUTDOWN_GRACE_S = 30.0


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Run Jupyter until it exits; a SIGTERM, SIGINT or SIGHUP to this process stops it.

    Each is passed on as SIGTERM, on which the Jupyter server shuts its kernels down and exits
    (no "Shutdown this Jupyter server (y/[n])?" prompt). Jupyter runs in its own session, so a
    Ctrl-C in the terminal reaches it once, through here. A server that has not exited
    ``_SHUTDOWN_GRACE_S`` after the signal is killed.
    """
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    stopping_since: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stopping_since.append(time.monotonic())

    previous = {name: signal.signal(getattr(signal, name), forward)
                for name in _FORWARDED_SIGNALS if hasattr(signal, name)}
    try:
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if stopping_since and time.monotonic() - stopping_since[0] > _SHUTDOWN_GRACE_S:
                    _say(f"JupyterLab did not stop within {_SHUTDOWN_GRACE_S:.0f} s of the signal; killing it.")
                    proc.kill()
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def cmd_agent(args: argparse.Namespace) -> int:
    from nbtrain._client.agent import serve

    return serve(sys.stdin, main)


def _default_notebook() -> Path | None:
    candidate = Path.cwd() / "notebooks" / "01_quickstart.ipynb"
    return candidate if candidate.exists() else None


NO_WARM_FLAG = "--no-warm"  # `nbtrain lab --no-warm`: the one lab flag that is not Jupyter's
ADDRESS_HELP = ("the cluster: ray://HOST:10001 over Ray Client, or HOST:6379 (its GCS) or auto on a node of it "
                "(default: where the registry says the run is, else $RAY_ADDRESS)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nbtrain", description="Distributed PyTorch training on Ray, from notebooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    cluster = sub.add_parser("cluster", help="the embedded local Ray cluster (127.0.0.1 only, token auth)")
    cluster.add_argument("action", choices=("start", "stop", "status", "add-node", "remove-node"),
                         help="start or stop the embedded cluster, say how it is, or add / remove a loopback node")
    cluster.add_argument("--num-cpus", "--cpus", type=int, default=None,
                         help="start: the head's CPUs (default: this machine's); add-node: the node's (default 1)")
    cluster.add_argument("--num-gpus", "--gpus", type=int, default=None,
                         help="start / add-node: the GPUs Ray may hand out there (default: none)")
    cluster.add_argument("--pid", type=int, default=None, help="remove-node: which added node (default: the newest)")
    cluster.set_defaults(func=cmd_cluster)
    runs = sub.add_parser(
        "runs", help="list runs: at once from this home's files, or as the cluster reports them (--live)",
        description="Without --live: every run this home launched or its embedded cluster keeps, from their files "
                    "(state, last step recorded, latest values), in well under a second, with the cluster up or "
                    "down; each row says where it comes from. A run that was going when its cluster stopped shows "
                    "as failed, lost with its cluster, at the last step it recorded. --live connects to the cluster "
                    "(seconds) for what only it knows: a live run's workers, stragglers and pause, and the sweeps.")
    runs.add_argument("--json", action="store_true", help="the cluster and its runs as one JSON object (the sidebar's)")
    runs.add_argument("--live", action="store_true", help="ask the cluster (connects; seconds) instead of the files")
    runs.add_argument("--address", default=None, help="ask this cluster: ray://HOST:10001, or HOST:6379 or auto on a "
                                                      "node of it (implies --live; default: the registry's cluster, "
                                                      "else $RAY_ADDRESS)")
    runs.set_defaults(func=cmd_runs)
    stop = sub.add_parser("stop", help="stop a run")
    stop.add_argument("name", help="the run's name")
    stop.add_argument("--address", default=None, help=ADDRESS_HELP)
    stop.set_defaults(func=cmd_stop)
    for verb, func, what in (("pause", cmd_pause, "hold a run's ranks at the same step (resources stay)"),
                             ("resume", cmd_resume, "let a paused run go on")):
        steer = sub.add_parser(verb, help=what)
        steer.add_argument("name", help="the run's name")
        steer.add_argument("--address", default=None, help=ADDRESS_HELP)
        steer.set_defaults(func=func)
    lab = sub.add_parser("lab", help="JupyterLab on 127.0.0.1 with the local cluster (or $RAY_ADDRESS)",
                         description=f"Every argument but {NO_WARM_FLAG} goes to `jupyter lab` as is: a notebook, "
                                     f"--port 9999, ... {NO_WARM_FLAG}: its notebooks' connect() warms no ranks "
                                     "for their first run (as connect(warm=False)).")
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER, metavar="JUPYTER ARGS")
    lab.set_defaults(func=cmd_lab)
    agent = sub.add_parser("agent", help="answer commands from stdin, one JSON list per line (used by the lab sidebar)")
    agent.set_defaults(func=cmd_agent)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lab"] and argv[1:2] not in (["-h"], ["--help"]):
        # Jupyter's own options (`--port 9999`) are not ours to parse: argparse would reject them.
        if NO_WARM_FLAG in argv[1:]:  # ours: its kernels' connect() warms no ranks
            from nbtrain._client.warm import WARM_START_ENV

            argv = [arg for arg in argv if arg != NO_WARM_FLAG]
            os.environ[WARM_START_ENV] = "0"
        args = argparse.Namespace(func=cmd_lab, jupyter_args=argv[1:])
    else:
        args = build_parser().parse_args(argv)

    try:
        return int(args.func(args))
    except NbtrainError as exc:
        print(f"nbtrain: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
