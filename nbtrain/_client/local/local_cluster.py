"""The embedded local cluster: a Ray head on 127.0.0.1 that the notebook joins as a Ray driver of its GCS
(``connect()``'s default: ``LocalClusterInfo.connect_address``), or reaches over Ray Client (``ray://``).

Why a real head rather than ``ray.init()`` in the kernel: runs must outlive the
kernel (restart it, the run goes on), and the notebook should talk to a laptop
as it talks to a cluster it runs on (a driver), or to a 100-GPU one (Ray Client).

The head is started as ``ray start --head --block`` in its own process session,
so stopping it means signalling that one process group: we never run a bare
``ray stop``, which would hit every Ray cluster on the machine. Every socket is
bound to 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` plus
``--node-ip-address``) and token authentication is on, so other local users
cannot drive it. Its state (``local.json``), token, start log and start lock live in
:func:`nbtrain._paths.local_cluster_dir` and Ray's own files in
:func:`nbtrain._paths.ray_temp_dir`, all owner-only; only starting the cluster
creates them.

One home, one head: starting holds an exclusive lock on ``cluster/start.lock``,
so two kernels connecting at once start one head and the second reuses it. A
pid in ``local.json`` is trusted only while its command line is this head's
(``ray start --head`` with our temp dir and client port): after a reboot the pid
may belong to anyone, and such a process is forgotten, never signalled. The
head runs the Python of the process that started it, so its ranks import that
environment's nbtrain; a notebook from another environment is told so rather
than silently using it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nbtrain._client.local import added_nodes
from nbtrain._client.local.local_head import LocalClusterInfo as LocalClusterInfo  # callers name it local_cluster.*
from nbtrain._client.local.local_head import check_environment, is_our_head, this_environment
from nbtrain._client.local.process_sessions import kill_group
from nbtrain._cluster.priority import lower_head_bookkeeping_priority
from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import LOOPBACK, free_port, port_is_open
from nbtrain._paths import (
    local_cluster_dir,
    local_cluster_workdir,
    private_dir,
    private_opener,
    ray_temp_dir,
    read_json,
    write_json_atomic,
)

START_TIMEOUT_S = 90.0
# how often a start looks for the head to be ready (its log's line and the client port: a file read and a
# refused connection): the head is ready 2.3 to 3.5 s after it is started on 2 cores, and a look every
# 0.25 s added 0.125 s on average to every start, and to a Run All's first point
READY_POLL_S = 0.05
Progress = Callable[[str], None]


def _state_file() -> Path:
    return local_cluster_dir() / "local.json"


def token_path() -> Path:
    """Where the local cluster's token is (it exists once the cluster was started)."""
    return local_cluster_dir() / "auth_token"


def _ensure_token() -> Path:
    """The token file, created once, owner-only; race-free between processes.

    The token is written in full to a private temporary file and then hard-linked
    into place, which fails if the file exists: of two kernels creating it at
    once, one wins and both use the winner's token, never a half-written one.
    """
    path = token_path()
    if path.exists():
        return path
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    with open(tmp, "w", opener=private_opener) as handle:
        handle.write(secrets.token_hex(32))
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path


def ray_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the local cluster's Ray processes (and for a plain-Ray driver of it,
    as in the benchmarks). nbtrain's own clients need none of it: they send the token per
    connection (:mod:`nbtrain._client.connecting.auth`). Creates the token file if it is missing."""
    env = dict(os.environ if base is None else base)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN_PATH"] = str(_ensure_token())
    # On a busy laptop Ray's agents can take longer than the 30 s the raylet waits by default.
    env.setdefault("RAY_agent_register_timeout_ms", "180000")
    # Ray starts workers at nice 15, which costs DDP ~13 % on a busy laptop; training is the job here.
    env.setdefault("RAY_worker_niceness", "0")
    # Ray Client's proxy forks one server process per session while its own gRPC threads run; with
    # gRPC's fork handlers on, that child sometimes dies before it can exec, with empty logs ("Starting
    # Ray client server failed", ray-project/ray#63202). The proxy always execs right after forking,
    # which is the case gRPC documents this switch for.
    env.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    # Every Ray process would export metrics every few seconds to a dashboard this cluster does
    # not run (and a random loopback port nobody scrapes): CPU taken from the ranks for nothing.
    env.setdefault("RAY_enable_metrics_collection", "0")
    # On SIGTERM a Ray node first drains for up to 30 s, so that a Serve proxy behind a load balancer
    # stops taking traffic; stopping this cluster ends every process of it: that wait made each stop
    # last the 10 s `kill_group` grants before SIGKILL.
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    # Ray runs `bash` to start each worker: a kernel started with an empty PATH still finds it.
    env["PATH"] = env.get("PATH") or os.defpath
    if env.get("NBTRAIN_HOME"):  # the cluster's processes run in another folder (process_folder)
        env["NBTRAIN_HOME"] = os.path.abspath(env["NBTRAIN_HOME"])
    return env


def _recorded() -> LocalClusterInfo | None:
    return LocalClusterInfo.from_record(read_json(_state_file()))


def status() -> LocalClusterInfo | None:
    """The running local cluster, or ``None``.

    A ``local.json`` whose head is gone, or whose pid now belongs to another
    process, is removed (unless a start holds the lock: then it is about to be replaced).
    """
    info = _recorded()
    if info is None:
        return None
    if not is_our_head(info):
        _forget_stale(info)
        return None
    return info if port_is_open(LOOPBACK, info.client_port) else None


def _forget_stale(info: LocalClusterInfo) -> None:
    with _start_lock(wait_s=0) as held:
        if held and _recorded() == info:
            _state_file().unlink(missing_ok=True)


@contextlib.contextmanager
def _start_lock(wait_s: float, say: Progress | None = None) -> Iterator[bool]:
    """Hold ``cluster/start.lock`` (yields ``True``), waiting up to ``wait_s`` for another process.

    Yields ``False`` when ``wait_s`` is 0 and the lock is taken. The kernel drops
    the lock when its holder exits, so a crashed start never blocks the next one.
    """
    directory = private_dir(local_cluster_dir())
    with open(directory / "start.lock", "a", opener=private_opener) as handle:
        began = time.monotonic()
        last_said: float | None = None
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - began
                if wait_s <= 0:
                    yield False
                    return
                if waited > wait_s:
                    msg = (f"Another process has been starting the local Ray cluster for {waited:.0f} s "
                           f"(it holds {directory / 'start.lock'}). Wait for it and connect again, or stop "
                           "that process (a notebook or `nbtrain` command connecting to the local cluster).")
                    raise ConnectionFailedError(msg) from None
                if say is not None and (last_said is None or waited - last_said >= 5):
                    say(f"Another process is starting the local Ray cluster; waiting for it… {waited:.0f} s")
                    last_said = waited
                time.sleep(0.25)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# `ray start`, run by this interpreter (the `ray` script may be on no PATH: `pip install --user` puts it in
# ~/.local/bin; an environment whose packages come from another's site directories has none beside its
# python), without the command line's other commands (see ray_head_process).
RAY_START = (sys.executable, "-m", "nbtrain._client.local.ray_head_process", "start")


def process_folder() -> Path:
    """The working directory of every process of the local cluster: the head's and each added node's
    processes keep the folder they were started in, and a notebook's folder may be renamed or deleted
    (then each new worker dies at ``import torch``). Ranks work in a folder chosen per run (see working_folder)."""
    return private_dir(local_cluster_workdir())


def start(
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    progress: Progress | None = None,
    timeout: float = START_TIMEOUT_S,
    attempts: int = 3,
) -> LocalClusterInfo:
    """Start the local cluster, or return the one already running.

    ``num_gpus`` defaults to what Ray detects; passing a number on a machine
    without GPUs creates *logical* GPUs (resources only), which tests use.
    Ray gives its raylet a fixed 30 s to register; on a heavily loaded machine
    that can run out, so a failed start is retried from scratch. A cluster
    started by another Python environment raises :class:`VersionMismatchError`.
    """
    say = progress or (lambda _msg: None)
    running = status()
    if running is None:
        with _start_lock(wait_s=attempts * (timeout + 30), say=say):
            running = status()  # another process may have started it while we waited
            if running is None:
                return _start_with_retries(num_cpus, num_gpus, say, timeout, attempts)
    check_environment(running)
    say(f"Reusing the local Ray cluster at {running.gcs_address} (Ray Client: {running.address})")
    return running


def _start_with_retries(num_cpus: int | None, num_gpus: int | None, say: Progress, timeout: float,
                        attempts: int) -> LocalClusterInfo:
    silent = _recorded()
    if silent is not None and is_our_head(silent):
        say(f"The local Ray cluster (pid {silent.pid}) does not answer on its client port; restarting it…")
        _stop_head(silent)
    for attempt in range(1, attempts + 1):
        try:
            return _start_once(num_cpus, num_gpus, say, timeout)
        except ConnectionFailedError as exc:
            if attempt == attempts:
                raise
            reason = str(exc).splitlines()
            say(f"The local Ray cluster failed to start (the machine may be busy): {reason[-1] if reason else exc}; "
                "trying once more…")
    raise AssertionError("unreachable")


# Ray's longest Unix socket is <temp dir>/session_<date>_<pid>/sockets/plasma_store; the kernel takes
# at most 107 bytes (103 on macOS) for such a path.
_SOCKET_SUFFIX = "/session_2000-01-01_00-00-00_000000_4194304/sockets/plasma_store"
_MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107
_FALLBACK_PREFIX = "nbtrain-ray-"


def choose_temp_dir() -> tuple[Path, str | None]:
    """Ray's temp dir for the head, and a note when it cannot be in ``$NBTRAIN_HOME``.

    Ray makes its temp dir and the directories in it world-writable (0777, for
    clusters shared between users) whenever one of its processes starts, so
    what keeps them private is an owner-only directory around them: the home,
    or a private ``/tmp/nbtrain-ray-*`` when the home's path would make Ray's
    socket paths too long.
    """
    preferred = ray_temp_dir()
    if len(str(preferred)) + len(_SOCKET_SUFFIX) <= _MAX_SOCKET_PATH:
        private_dir(preferred.parent)
        return preferred, None
    fallback = Path(tempfile.mkdtemp(prefix=_FALLBACK_PREFIX, dir="/tmp")) / "ray"  # mkdtemp makes it 0700
    note = (f"{preferred} is too long for Ray's Unix socket paths ({_MAX_SOCKET_PATH} bytes at most), so this "
            f"cluster's Ray files are in {fallback} (in an owner-only directory); a shorter NBTRAIN_HOME keeps "
            "them in the home.")
    return fallback, note


def _remove_temp_dir(temp_dir: str) -> None:
    shutil.rmtree(temp_dir, ignore_errors=True)
    container = Path(temp_dir).parent
    if container.parent == Path("/tmp") and container.name.startswith(_FALLBACK_PREFIX):
        shutil.rmtree(container, ignore_errors=True)


def _start_once(num_cpus: int | None, num_gpus: int | None, say: Progress, timeout: float) -> LocalClusterInfo:
    num_cpus = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
    temp_path, note = choose_temp_dir()
    temp_dir = str(temp_path)
    ports = {name: free_port() for name in (
        "port", "ray-client-server-port", "node-manager-port", "object-manager-port",
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
        "runtime-env-agent-port")}
    cmd = [
        *RAY_START, "--head", "--block",
        f"--node-ip-address={LOOPBACK}", f"--num-cpus={num_cpus}",
        "--include-dashboard=false", "--include-log-monitor=false", "--disable-usage-stats", f"--temp-dir={temp_dir}",
        # Workers bind ports the OS picks: Ray's fixed default range (10002-19999) is the same for every
        # cluster, so two embedded clusters on one machine (two environments, two users) would collide.
        "--min-worker-port=0", "--max-worker-port=0",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    log_path = private_dir(local_cluster_dir()) / "ray-start.log"
    if note:
        say(note)
    say(f"Starting a local Ray cluster on {LOOPBACK} ({num_cpus} CPUs)…")
    env = ray_env()
    with open(log_path, "w", opener=private_opener) as log:
        if note:
            log.write(note + "\n")
            log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=process_folder(), start_new_session=True)
    info = LocalClusterInfo(pid=proc.pid, gcs_port=ports["port"],
                            client_port=ports["ray-client-server-port"], token_path=env["RAY_AUTH_TOKEN_PATH"],
                            temp_dir=temp_dir, num_cpus=num_cpus, num_gpus=num_gpus or 0,
                            started=time.time(), **this_environment())
    deadline = time.monotonic() + timeout
    began = time.monotonic()
    last_said = began
    while not (runtime_started(log_path) and port_is_open(LOOPBACK, info.client_port, timeout=0.5)):
        if proc.poll() is not None:
            _remove_temp_dir(temp_dir)
            msg = (f"The local Ray cluster exited while starting (exit code {proc.returncode}). "
                   f"Its output is in {log_path}:\n{tail(log_path)}")
            raise ConnectionFailedError(msg)
        if time.monotonic() > deadline:
            kill_group(proc.pid)
            _remove_temp_dir(temp_dir)
            msg = (f"The local Ray cluster did not open its client port within {timeout:.0f} s. "
                   f"See {log_path}:\n{tail(log_path)}")
            raise ConnectionFailedError(msg)
        if time.monotonic() - last_said >= 2:
            say(f"Starting a local Ray cluster… {time.monotonic() - began:.0f} s")
            last_said = time.monotonic()
        time.sleep(READY_POLL_S)
    lower_head_bookkeeping_priority(proc.pid)
    write_json_atomic(_state_file(), dataclasses.asdict(info))
    say(f"Local Ray cluster ready at {info.gcs_address} (Ray Client: {info.address}) "
        f"({time.monotonic() - began:.1f} s)")
    return info


def runtime_started(log_path: Path) -> bool:
    try:
        return "Ray runtime started" in log_path.read_text(errors="replace")
    except OSError:
        return False


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop_head(info: LocalClusterInfo) -> None:
    kill_group(info.pid)
    _remove_temp_dir(info.temp_dir)


def stop() -> bool:
    """Stop the local cluster this home started; returns whether one was running.

    Only a head that :func:`is_our_head` recognises is signalled; a ``local.json``
    naming any other process is just removed.
    """
    if not _state_file().exists():
        return False
    with _start_lock(wait_s=START_TIMEOUT_S * 3 + 90):
        info = _recorded()
        if info is None:
            return False
        ours = is_our_head(info)
        if ours:
            added_nodes.remove_all()
            _stop_head(info)
        _state_file().unlink(missing_ok=True)
        return ours
