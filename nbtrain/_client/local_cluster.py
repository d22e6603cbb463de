"""The embedded local cluster: a Ray head on 127.0.0.1 that the notebook reaches over ``ray://``.

Why a real head rather than ``ray.init()`` in the kernel: runs must outlive the
kernel (restart it, the run goes on), and the notebook should talk to a laptop
exactly as it talks to a 100-GPU cluster, through Ray Client.

The head is started as ``ray start --head --block`` in its own process session,
so stopping it means signalling that one process group: we never run a bare
``ray stop``, which would hit every Ray cluster on the machine. Every socket is
bound to 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` plus
``--node-ip-address``) and token authentication is on, so other local users
cannot drive it. Its state (``local.json``), token and start log live in
:func:`nbtrain._paths.local_cluster_dir`; only starting the cluster creates them.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nbtrain._cluster.priority import lower_head_bookkeeping_priority
from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import LOOPBACK, free_port, port_is_open
from nbtrain._paths import local_cluster_dir, read_json, write_json_atomic

START_TIMEOUT_S = 90.0
Progress = Callable[[str], None]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclasses.dataclass
class LocalClusterInfo:
    pid: int
    gcs_port: int
    client_port: int
    token_path: str
    temp_dir: str
    num_cpus: int
    num_gpus: int
    started: float

    @property
    def address(self) -> str:
        return f"ray://{LOOPBACK}:{self.client_port}"

    @property
    def gcs_address(self) -> str:
        return f"{LOOPBACK}:{self.gcs_port}"


def _state_file() -> Path:
    return local_cluster_dir() / "local.json"


def token_path() -> Path:
    """Where the local cluster's token is (it exists once the cluster was started)."""
    return local_cluster_dir() / "auth_token"


def _ensure_token() -> Path:
    """The token file, created once with owner-only permissions."""
    path = token_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
    return path


def ray_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the local cluster's Ray processes (and for a plain-Ray driver of it,
    as in the benchmarks). nbtrain's own clients need none of it: they send the token per
    connection (:mod:`nbtrain._client.auth`). Creates the token file if it is missing."""
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
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    return env


def status() -> LocalClusterInfo | None:
    """The running local cluster, or ``None`` (stale state files are cleaned up)."""
    data = read_json(_state_file())
    if not data:
        return None
    info = LocalClusterInfo(**data)
    if pid_alive(info.pid) and port_is_open(LOOPBACK, info.client_port):
        return info
    if not pid_alive(info.pid):
        _state_file().unlink(missing_ok=True)
    return None


def _ray_executable() -> str:
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else (shutil.which("ray") or "ray")


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
    that can run out, so a failed start is retried from scratch.
    """
    say = progress or (lambda _msg: None)
    running = status()
    if running is not None:
        say(f"Reusing the local Ray cluster at {running.address}")
        return running
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


def _start_once(num_cpus: int | None, num_gpus: int | None, say: Progress, timeout: float) -> LocalClusterInfo:
    num_cpus = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
    temp_dir = f"/tmp/nbtrain-ray-{secrets.token_hex(3)}"  # short: Ray's unix sockets have a path limit
    ports = {name: free_port() for name in (
        "port", "ray-client-server-port", "node-manager-port", "object-manager-port",
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
        "runtime-env-agent-port")}
    cmd = [
        _ray_executable(), "start", "--head", "--block",
        f"--node-ip-address={LOOPBACK}", f"--num-cpus={num_cpus}",
        "--include-dashboard=false", "--include-log-monitor=false", "--disable-usage-stats", f"--temp-dir={temp_dir}",
        # Workers bind ports the OS picks: Ray's fixed default range (10002-19999) is the same for every
        # cluster, so two embedded clusters on one machine (two environments, two users) would collide.
        "--min-worker-port=0", "--max-worker-port=0",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    local_cluster_dir().mkdir(parents=True, exist_ok=True)
    log_path = local_cluster_dir() / "ray-start.log"
    say(f"Starting a local Ray cluster on {LOOPBACK} ({num_cpus} CPUs)…")
    env = ray_env()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    info = LocalClusterInfo(pid=proc.pid, gcs_port=ports["port"],
                            client_port=ports["ray-client-server-port"], token_path=env["RAY_AUTH_TOKEN_PATH"],
                            temp_dir=temp_dir, num_cpus=num_cpus, num_gpus=num_gpus or 0,
                            started=time.time())
    deadline = time.monotonic() + timeout
    began = time.monotonic()
    last_said = began
    while not (_started(log_path) and port_is_open(LOOPBACK, info.client_port, timeout=0.5)):
        if proc.poll() is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
            msg = (f"The local Ray cluster exited while starting (exit code {proc.returncode}). "
                   f"Its output is in {log_path}:\n{_tail(log_path)}")
            raise ConnectionFailedError(msg)
        if time.monotonic() > deadline:
            _kill_group(proc.pid)
            msg = (f"The local Ray cluster did not open its client port within {timeout:.0f} s. "
                   f"See {log_path}:\n{_tail(log_path)}")
            raise ConnectionFailedError(msg)
        if time.monotonic() - last_said >= 2:
            say(f"Starting a local Ray cluster… {time.monotonic() - began:.0f} s")
            last_said = time.monotonic()
        time.sleep(0.25)
    lower_head_bookkeeping_priority(proc.pid)
    write_json_atomic(_state_file(), dataclasses.asdict(info))
    say(f"Local Ray cluster ready at {info.address} ({time.monotonic() - began:.1f} s)")
    return info


def _started(log_path: Path) -> bool:
    try:
        return "Ray runtime started" in log_path.read_text(errors="replace")
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _kill_group(pid: int, grace: float = 10.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop() -> bool:
    """Stop the local cluster this home started; returns whether one was running."""
    data = read_json(_state_file())
    if not data:
        return False
    info = LocalClusterInfo(**data)
    _kill_group(info.pid)
    _state_file().unlink(missing_ok=True)
    shutil.rmtree(info.temp_dir, ignore_errors=True)
    return True
