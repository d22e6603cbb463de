"""A plain Ray cluster started as its operators would (``ray start --head``), on loopback with token auth:
what a kernel running on a user's own cluster connects to. Stopped by the PIDs whose command line names
its own temp dir, never by a bare ``ray stop``.

``python`` picks the interpreter whose Ray starts it (the oldest Ray's virtualenv, for the version tests).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from nbtrain._net import free_port, port_is_open


@dataclass
class PlainCluster:
    root: Path  # RAY_TMPDIR for a driver that finds it with "auto" (Ray's temp dir is root/ray)
    gcs_port: int
    client_port: int
    token: str
    token_path: Path
    python: str

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    def driver_env(self, **extra: str) -> dict[str, str]:
        """A kernel's environment on this cluster's node: Ray's temp dir where "auto" finds it, nothing of the
        token (connect() is given it, or finds it in the places Ray reads), and none of the loopback switch
        (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``) that the cluster itself was started with."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RAY_AUTH") and k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
        env.update(RAY_TMPDIR=str(self.root), **extra)
        return env

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: those naming its temp dir, and those naming its GCS address (Ray
        Client's proxy and its per-session servers name nothing else, and outlive `ray start`'s parent)."""
        gcs = re.compile(rf"(^|[=\s])127\.0\.0\.1:{self.gcs_port}$")  # this port, not one it is a prefix of
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(self.root) in part or gcs.search(part) for part in proc.info["cmdline"] or ()):
                    found.append(proc)
        return found


def start(python: str = sys.executable, num_cpus: int = 4, default_ports: bool = False) -> PlainCluster:
    """``default_ports``: the GCS on 6379 and Ray Client on 10001, as ``ray start --head`` and KubeRay lay a
    head out (the other ports stay free ones)."""
    root = Path(tempfile.mkdtemp(prefix="nbt-pc-", dir="/tmp"))  # short: Ray's socket paths live under it
    token = secrets.token_hex(32)
    token_path = root / "token"
    token_path.write_text(token)
    token_path.chmod(0o600)
    ports = {name: free_port() for name in (
        "port", "ray-client-server-port", "node-manager-port", "object-manager-port",
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")}
    if default_ports:
        ports.update({"port": 6379, "ray-client-server-port": 10001})
        taken = [port for port in (6379, 10001) if port_is_open("127.0.0.1", port)]
        assert not taken, f"a cluster laid out as Ray's defaults needs 127.0.0.1:{taken} free"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_TMPDIR=str(root), RAY_enable_metrics_collection="0", GRPC_ENABLE_FORK_SUPPORT="false",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    cmd = [python, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address=127.0.0.1",
           f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats",
           f"--temp-dir={root / 'ray'}", "--min-worker-port=0", "--max-worker-port=0",
           *(f"--{name}={port}" for name, port in ports.items())]
    cluster = PlainCluster(root, ports["port"], ports["ray-client-server-port"], token, token_path, python)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=root)
    if done.returncode != 0 or not port_is_open("127.0.0.1", cluster.gcs_port):
        stop(cluster)
        raise RuntimeError(f"ray start failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    deadline = time.monotonic() + 60
    while not port_is_open("127.0.0.1", cluster.client_port) and time.monotonic() < deadline:
        time.sleep(0.25)
    return cluster


def stop(cluster: PlainCluster) -> None:
    """End every process of this cluster (each names its temp dir), then remove the dir."""
    import shutil

    for _ in range(3):
        procs = cluster.processes()
        if not procs:
            break
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _gone, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    shutil.rmtree(cluster.root, ignore_errors=True)


@contextlib.contextmanager
def running(python: str = sys.executable, num_cpus: int = 4, default_ports: bool = False) -> Iterator[PlainCluster]:
    cluster = start(python, num_cpus, default_ports)
    try:
        yield cluster
    finally:
        stop(cluster)


def run_python(code: str, env: dict[str, str], python: str = sys.executable, timeout: float = 240,
               cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (a kernel, or a restarted one), its output captured."""
    return subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
