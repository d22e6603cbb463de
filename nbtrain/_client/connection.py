"""Connecting the notebook to a Ray cluster, always over Ray Client (``ray://``).

Ray Client reports a dead address, a missing token and a wrong token all as
``ConnectionError: ray client connection timeout`` after ~30 s. We tell them
apart first, in milliseconds: is anything listening on the port (TCP), and does
a Ray Client *ping* with our token come back ``UNAUTHENTICATED``?
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from nbtrain._client import local_cluster
from nbtrain._exceptions import ConnectionFailedError, NotConnectedError, VersionMismatchError
from nbtrain._paths import nbtrain_home, write_json_atomic

NAMESPACE = "nbtrain"
DEFAULT_CLIENT_PORT = 10001
PREFLIGHT_TIMEOUT_S = 3.0
CONNECT_ATTEMPTS = 3
Progress = Callable[[str], None]


@dataclasses.dataclass
class Cluster:
    """The connected cluster. ``kind`` is ``"local"`` for the embedded cluster."""

    address: str
    kind: str
    ray_version: str
    python_version: str

    def resources(self) -> dict[str, tuple[float, float]]:
        """``{"CPU": (used, total), "GPU": (used, total), ...}`` right now."""
        import ray

        total = ray.cluster_resources()
        free = ray.available_resources()
        return {key: (total[key] - free.get(key, 0.0), total[key]) for key in ("CPU", "GPU", "memory")
                if key in total}

    def nodes(self) -> list[dict[str, Any]]:
        import ray

        return [{"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"],
                 "cpus": n["Resources"].get("CPU", 0), "gpus": n["Resources"].get("GPU", 0),
                 "head": "node:__internal_head__" in n["Resources"]}
                for n in ray.nodes()]

    def describe(self) -> str:
        res = self.resources()
        alive = [n for n in self.nodes() if n["alive"]]
        parts = [f"{key} {used:g}/{total:g} used" for key, (used, total) in res.items() if key != "memory"]
        return f"{self.address} ({self.kind}): {len(alive)} node(s), " + ", ".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"<nbtrain.Cluster {self.describe()}>")


_current: Cluster | None = None
_recorded_at = float("-inf")  # monotonic time record_current() last wrote cluster.json


def current() -> Cluster:
    if _current is None:
        msg = "Not connected to a Ray cluster. Run `nbtrain.connect()` (or `%ray_connect`) first."
        raise NotConnectedError(msg)
    if not _ray_connected():
        msg = (f"The connection to {_current.address} was lost. Runs keep going on the cluster; "
               f"reconnect with `nbtrain.connect({_current.address!r})` and `nbtrain.attach(name)`.")
        raise NotConnectedError(msg)
    return _current


def _ray_connected() -> bool:
    import ray

    return ray.is_initialized()


def connect(address: str | None = None, *, token: str | None = None, num_cpus: int | None = None,
            num_gpus: int | None = None, progress: Progress | None = None,
            timeout: float = 120.0) -> Cluster:
    """Connect the notebook to a Ray cluster and return it.

    ``address`` is ``ray://host:port`` (the Ray Client port, 10001 by default).
    Without one, ``$RAY_ADDRESS`` is used, else the embedded local cluster: a Ray
    head on 127.0.0.1 started in the background (and reused later), with token
    authentication on. ``token`` authenticates to a cluster running with
    ``RAY_AUTH_MODE=token`` (else ``$RAY_AUTH_TOKEN`` / ``$RAY_AUTH_TOKEN_PATH``).

    Example::

        cluster = nbtrain.connect()                      # local
        cluster = nbtrain.connect("ray://head:10001")     # remote
    """
    global _current
    say = progress or _default_progress
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address.strip().lower() in ("local", "auto-local"):
        address = None
    kind = "remote"
    local_temp_dir = None
    if address is None:
        info = local_cluster.start(num_cpus=num_cpus, num_gpus=num_gpus, progress=say)
        address = info.address
        kind = "local"
        token_value = Path(info.token_path).read_text().strip()
        local_temp_dir = info.temp_dir
    else:
        address = _normalise(address)
        token_value = _resolve_token(token, address)
    if _current is not None and _current.address == address and _ray_connected():
        return _current
    disconnect()
    host, port = _host_port(address)
    _preflight(address, host, port, token_value)
    _configure_auth(token_value)
    import ray

    say(f"Connecting to {address}…")
    began = time.monotonic()
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            ray.init(address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
            break
        except Exception as exc:  # noqa: BLE001 - Ray Client raises several types here
            error = _explain_connect_error(address, exc, local_temp_dir)
            # The preflight proved the server answers. Ray Client starts one server process per
            # session; on a busy head that start occasionally fails and a new session succeeds.
            # On a busy 2-core head one session start takes 20-45 s, so the budget allows 3 of them.
            out_of_time = time.monotonic() - began > timeout
            if attempt == CONNECT_ATTEMPTS or out_of_time or isinstance(error, VersionMismatchError):
                raise error from None
            if ray.is_initialized():
                ray.shutdown()
            say(f"Connecting to {address} failed ({type(exc).__name__}); "
                f"trying again ({attempt + 1}/{CONNECT_ATTEMPTS})…")
            time.sleep(2.0 * attempt)
    versions = _cluster_versions(lower_session_priority=_is_embedded(address))
    _check_versions(versions)
    _current = Cluster(address=address, kind=kind, ray_version=versions["ray"], python_version=versions["python"])
    say(f"Connected to {address} in {time.monotonic() - began:.1f} s")
    _record(_current)
    return _current


def disconnect() -> None:
    """Drop the connection. Runs keep going on the cluster; ``attach()`` gets them back."""
    global _current
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _current = None


def _default_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _normalise(address: str) -> str:
    address = address.strip()
    if "://" not in address:
        address = f"ray://{address}"
    parsed = urlparse(address)
    if parsed.scheme != "ray":
        msg = (f"nbtrain connects over Ray Client, so the address must look like ray://host:10001, "
               f"not {address!r}. Use the head node's Ray Client port (10001 unless changed).")
        raise ConnectionFailedError(msg)
    if parsed.port is None:
        address = f"ray://{parsed.hostname}:{DEFAULT_CLIENT_PORT}"
    return address


def _host_port(address: str) -> tuple[str, int]:
    parsed = urlparse(address)
    return parsed.hostname or "127.0.0.1", parsed.port or DEFAULT_CLIENT_PORT


def _resolve_token(token: str | None, address: str) -> str | None:
    if token:
        return token
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), Path.home() / ".ray" / "auth_token"):
        if candidate and Path(candidate).is_file():
            text = Path(candidate).read_text().strip()
            if text:  # nbtrain's own client token file starts out empty
                return text
    local = local_cluster.status()
    if local is not None and local.address == address:
        return Path(local.token_path).read_text().strip()
    return None


def _preflight(address: str, host: str, port: int, token: str | None) -> None:
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror:
        msg = f"Cannot resolve the host in {address}. Check the spelling of the head node's name."
        raise ConnectionFailedError(msg) from None
    if not local_cluster.port_is_open(host, port, timeout=PREFLIGHT_TIMEOUT_S):
        msg = (f"Nothing is listening at {address}. Check that the Ray head is running "
               f"(`ray status` on the head), that {port} is its Ray Client port "
               f"(`ray start --head --ray-client-server-port={port}`), and that a firewall or "
               f"port-forward lets this machine reach {host}:{port}.")
        raise ConnectionFailedError(msg)
    import grpc
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        stub.ClusterInfo(ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING),
                         timeout=PREFLIGHT_TIMEOUT_S * 2, metadata=metadata)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            if token:
                msg = (f"The cluster at {address} rejected the authentication token. Pass the cluster's "
                       f"token: `nbtrain.connect(address, token=...)` or set RAY_AUTH_TOKEN "
                       f"(on the head: `ray get-auth-token`).")
            else:
                msg = (f"The cluster at {address} requires a token (RAY_AUTH_MODE=token) and none was given. "
                       f"Pass `token=` or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH "
                       f"(on the head: `ray get-auth-token`).")
            raise ConnectionFailedError(msg) from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
            msg = (f"Something is listening at {address}, but it does not answer as a Ray Client server "
                   f"({code.name}). Check the port: it must be the head's Ray Client port "
                   f"(--ray-client-server-port, 10001 by default), not the GCS or dashboard port.")
            raise ConnectionFailedError(msg) from None
    finally:
        channel.close()


def _configure_auth(token: str | None) -> None:
    """Hand Ray's client-side token loader the token for this address (or none)."""
    from ray._raylet import AuthenticationTokenLoader, get_authentication_mode

    from nbtrain._auth_env import client_token_file

    if token is not None and int(get_authentication_mode()) == 0:
        msg = ("This cluster needs a token, but Ray was imported before nbtrain with token "
               "authentication off (Ray reads RAY_AUTH_MODE only at import). Restart the kernel and "
               "import nbtrain before ray, or set RAY_AUTH_MODE=token in the kernel's environment.")
        raise ConnectionFailedError(msg)
    path = client_token_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token or "")
    if os.environ.get("RAY_AUTH_TOKEN_PATH") != str(path):
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    AuthenticationTokenLoader.instance().reset_cache()  # it caches the first token it read


def _explain_connect_error(address: str, exc: Exception, local_temp_dir: str | None = None) -> Exception:
    text = str(exc)
    if "version" in text.lower() and ("mismatch" in text.lower() or "differ" in text.lower()):
        return VersionMismatchError(
            f"Ray refused the connection to {address} because versions differ: {text}. "
            f"This notebook has Python {platform.python_version()} and Ray {_ray_version()}; "
            f"install the cluster's versions in the notebook's environment (or vice versa).")
    message = f"Could not connect to {address}: {type(exc).__name__}: {text}"
    server_log = _client_server_log(text, local_temp_dir)
    if server_log:
        message += f"\nThe end of that server's log:\n{server_log}"
    return ConnectionFailedError(message)


def _client_server_log(error_text: str, local_temp_dir: str | None) -> str:
    """The tail of the per-session server log Ray's error names, when the cluster is ours to read."""
    match = re.search(r"(ray_client_server_\d+)\.err", error_text)
    if not match or not local_temp_dir:
        return ""
    logs = Path(local_temp_dir) / "session_latest" / "logs"
    lines: list[str] = []
    for path in sorted(logs.glob(f"{match.group(1)}*")):
        try:
            lines += [f"  {path.name}: {line}" for line in path.read_text(errors="replace").splitlines()[-15:]]
        except OSError:
            continue
    return "\n".join(lines)


def _ray_version() -> str:
    import ray

    return str(ray.__version__)


def _is_embedded(address: str) -> bool:
    info = local_cluster.status()
    return info is not None and info.address == address


def _cluster_versions(lower_session_priority: bool = False) -> dict[str, str]:
    """Versions as a worker on the cluster sees them, asked of a short-lived actor.

    An actor rather than a task: a task's worker process would stay in Ray's pool,
    idle but waking up, on cores the training ranks need; the actor's process ends
    with it. On the embedded cluster the same actor also lowers the priority of
    this session's Ray Client server (see ``_priority``): only once the session is
    up, so connecting stays quick while a run trains.
    """
    import ray

    @ray.remote(num_cpus=0)
    class VersionProbe:
        def versions(self, lower_session_priority: bool) -> dict[str, str]:
            import platform as remote_platform

            import ray as remote_ray

            try:
                import nbtrain as remote_nbtrain

                nbtrain_version = remote_nbtrain.__version__
            except ImportError as exc:
                nbtrain_version = f"missing: {exc}"
            else:
                if lower_session_priority:
                    from nbtrain._cluster.priority import lower_session_server_priority

                    lower_session_server_priority()
            return {"ray": remote_ray.__version__, "python": remote_platform.python_version(),
                    "nbtrain": nbtrain_version}

    probe = VersionProbe.remote()  # type: ignore[attr-defined]
    try:
        return ray.get(probe.versions.remote(lower_session_priority), timeout=120)
    finally:
        ray.kill(probe)


def _check_versions(cluster: dict[str, str]) -> None:
    check_versions(cluster, {"ray": _ray_version(), "python": platform.python_version()})


def check_versions(cluster: dict[str, str], local: dict[str, str]) -> None:
    """Raise :class:`VersionMismatchError` naming both sides when Ray or Python (major.minor) differ."""
    problems = []
    if cluster["ray"] != local["ray"]:
        problems.append(f"Ray {local['ray']} in the notebook but Ray {cluster['ray']} on the cluster")
    if cluster["python"].split(".")[:2] != local["python"].split(".")[:2]:
        problems.append(f"Python {local['python']} in the notebook but Python {cluster['python']} on the cluster")
    if problems:
        msg = ("The notebook and the cluster run different versions: " + "; ".join(problems) +
               f". Install matching versions in the notebook's environment, e.g. `pip install ray[client]=={cluster['ray']}`.")
        raise VersionMismatchError(msg)
    if cluster.get("nbtrain", "").startswith("missing"):
        msg = (f"nbtrain cannot be imported on the cluster's nodes ({cluster['nbtrain']}). Install it there "
               "(`pip install nbtrain` in the image/nodes) so workers can run the training loop.")
        raise ConnectionFailedError(msg)


def record_current(min_interval_s: float = 5.0) -> None:
    """Refresh the sidebar's view of the connected cluster, if connected and not done lately
    (it costs two round trips to the cluster)."""
    global _recorded_at
    now = time.monotonic()
    if _current is None or now - _recorded_at < min_interval_s or not _ray_connected():
        return
    _recorded_at = now
    try:
        _record(_current)
    except OSError:
        pass


def _record(cluster: Cluster) -> None:
    """Mirror the connection for the JupyterLab sidebar."""
    try:
        res = cluster.resources()
        nodes = [n for n in cluster.nodes() if n["alive"]]
    except Exception:  # noqa: BLE001 - the sidebar is a convenience, never a failure
        return
    write_json_atomic(nbtrain_home() / "cluster.json", {
        "address": cluster.address, "kind": cluster.kind, "nodes": len(nodes),
        "resources": {key: list(value) for key, value in res.items() if key in ("CPU", "GPU")},
        "updated": time.time(),
    })
