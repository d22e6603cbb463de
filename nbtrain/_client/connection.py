"""Connecting the notebook to a Ray cluster, always over Ray Client (``ray://``).

Which token, how it is sent (per connection, whatever was imported first) and
the fast check that names a dead address or a refused token live in
:mod:`nbtrain._client.auth`. Connecting records the cluster for the JupyterLab
sidebar once (:func:`nbtrain._registry.record_connection`); reading it never writes.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packaging.version import InvalidVersion, Version

from nbtrain._client import auth
from nbtrain._client.local import local_cluster, local_head
from nbtrain._cluster.names import NAMESPACE
from nbtrain._exceptions import ConnectionFailedError, NotConnectedError, VersionMismatchError
from nbtrain._ray_compat import init_with_metadata, is_head_node, turn_off_auto_init
from nbtrain._registry import record_connection
from nbtrain._version import TESTED_RAY_MINORS, __version__

DEFAULT_CLIENT_PORT = 10001
MIN_RAY = (2, 54)  # 2.52-2.53: the dashboard agent's HTTP job endpoint skips the token check
CONNECT_ATTEMPTS = 3
Progress = Callable[[str], None]


@dataclasses.dataclass
class Cluster:
    """The connected cluster, from :func:`connect`: its ``address`` (``ray://host:port``), ``kind``
    (``"local"`` for the embedded cluster, else ``"remote"``), and the ``ray_version`` and ``python_version``
    it runs. Its methods ask Ray now, so they need the connection to be live.

    Example::

        cluster = nbtrain.connect()
        cluster.resources()["CPU"]     # (used, total)
    """

    address: str
    kind: str
    ray_version: str
    python_version: str

    def resources(self) -> dict[str, tuple[float, float]]:
        """What the cluster has and what is in use right now, e.g. to size a launch's ``workers``.

        Returns:
            ``{"CPU": (used, total), "GPU": (used, total), "memory": (used, total)}``, each key only when
            the cluster has that resource (memory in bytes).

        Example::

            used, total = cluster.resources()["CPU"]
        """
        import ray

        total = ray.cluster_resources()
        free = ray.available_resources()
        return {key: (total[key] - free.get(key, 0.0), total[key]) for key in ("CPU", "GPU", "memory")
                if key in total}

    def nodes(self) -> list[dict[str, Any]]:
        """Every node Ray knows of, live or dead, e.g. to name one to :meth:`Run.drain`.

        Returns:
            One dict per node, with ``node_id`` (Ray's), ``address``, ``alive``, ``cpus``, ``gpus`` and ``head``.

        Example::

            [n["node_id"][:6] for n in cluster.nodes() if n["alive"] and not n["head"]]
        """
        import ray

        return [{"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"],
                 "cpus": n["Resources"].get("CPU", 0), "gpus": n["Resources"].get("GPU", 0),
                 "head": is_head_node(n)}
                for n in ray.nodes()]

    def describe(self) -> str:
        """One line for people: the address, the kind, how many nodes are live, CPUs and GPUs in use.

        Returns:
            E.g. ``"ray://127.0.0.1:10001 (local): 1 node(s), CPU 2/8 used"``.
        """
        res = self.resources()
        alive = [n for n in self.nodes() if n["alive"]]
        parts = [f"{key} {used:g}/{total:g} used" for key, (used, total) in res.items() if key != "memory"]
        return f"{self.address} ({self.kind}): {len(alive)} node(s), " + ", ".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"<nbtrain.Cluster {self.describe()}>")


_current: Cluster | None = None
_current_token: str | None = None  # what the live connection authenticated with: a different one reconnects
_current_anchor: Any = None  # the session's SessionAnchor: an actor the session owns lives while a handle does


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

    return bool(ray.is_initialized())


def connect(address: str | None = None, *, token: str | None = None, num_cpus: int | None = None,
            num_gpus: int | None = None, progress: Progress | None = None,
            timeout: float = 120.0) -> Cluster:
    """Connect the notebook to a Ray cluster and return it.

    ``address`` is ``ray://host:port`` (the Ray Client port, 10001 by default).
    Without one, ``$RAY_ADDRESS`` is used, else the embedded local cluster: a Ray
    head on 127.0.0.1 started in the background (and reused later), with token
    authentication on. ``token`` authenticates to a cluster running with
    ``RAY_AUTH_MODE=token``; once that cluster accepts it, it is kept for this
    address alone (``$NBTRAIN_HOME/tokens.json``, owner-only), so a later
    ``connect(address)`` needs no token. Without one: the token kept for this
    address, else ``$RAY_AUTH_TOKEN`` / ``$RAY_AUTH_TOKEN_PATH`` / ``~/.ray/auth_token``,
    except a token that belongs to another cluster (the embedded one's included):
    a cluster never receives another's token. The token goes with this connection
    only, so it works whether or not ``ray`` was imported first, and changes no
    environment variable. Needs Ray >= 2.54 in the notebook and on the cluster.
    A cluster running Ray's own TLS (``RAY_USE_TLS=1``) is reached over TLS when the
    kernel's environment has ``RAY_USE_TLS=1`` and ``RAY_TLS_SERVER_CERT``,
    ``RAY_TLS_SERVER_KEY``, ``RAY_TLS_CA_CERT`` (its certificate, its key, the CA).

    Args:
        address: ``ray://host:port``; ``None`` for ``$RAY_ADDRESS`` or the embedded cluster.
        token: the cluster's token (prefer ``$RAY_AUTH_TOKEN`` or a kept one in notebooks).
        num_cpus: CPUs of the embedded cluster when this call starts it (default: the machine's).
        num_gpus: GPUs of the embedded cluster when this call starts it.
        progress: called with each progress message (default: printed to stderr).
        timeout: seconds to wait for the cluster.

    Returns:
        The connected :class:`Cluster`.

    Raises:
        ConnectionFailedError: the address cannot be reached, it refused the token, or TLS is on for
            only one side (or a TLS file is missing).
        VersionMismatchError: the notebook and the cluster run different Ray, Python or nbtrain.

    Example::

        cluster = nbtrain.connect()                      # local
        cluster = nbtrain.connect("ray://head:10001")     # remote
    """
    say = progress or _default_progress
    cluster = open_session(address, token=token, num_cpus=num_cpus, num_gpus=num_gpus, progress=say, timeout=timeout)
    try:
        record_connection(cluster.address, cluster.kind)
    except OSError as exc:  # the sidebar's cluster line is a convenience; connecting worked
        say(f"(The JupyterLab sidebar will not show this cluster: {exc})")
    return cluster


def open_session(address: str | None = None, *, token: str | None = None, num_cpus: int | None = None,
                 num_gpus: int | None = None, progress: Progress | None = None,
                 timeout: float = 120.0) -> Cluster:
    """:func:`connect` without telling the sidebar: for readers (``nbtrain runs``, the lab's agent)."""
    global _current, _current_token, _current_anchor
    check_connect_arguments(address, token)
    check_ray_supported(_ray_version(), "notebook")
    say = progress or _default_progress
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address.strip().lower() in ("local", "auto-local"):
        address = None
    if address is None:
        address = local_cluster.start(num_cpus=num_cpus, num_gpus=num_gpus, progress=say).address
    else:
        address = _normalise(address)
    local = _embedded(address)  # also when RAY_ADDRESS names it (Binder, `nbtrain lab`)
    kind = "local" if local else "remote"
    resolved = auth.resolve_token(token, address)
    if (_current is not None and _current.address == address and resolved.value == _current_token
            and _ray_connected()):
        return _current
    disconnect()
    host, port = _host_port(address)
    auth.preflight(address, host, port, resolved.value, source=resolved.source, withheld=resolved.withheld)
    if token and local is None:  # the cluster took it: later connections to this address find it
        auth.remember_token(address, token)
    auth.check_kernel_ray(address)
    import ray

    turn_off_auto_init()  # a Ray call while disconnected raises from now on, never starts a Ray here
    say(f"Connecting to {address}…")
    began = time.monotonic()
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            context = init_with_metadata(address, auth.grpc_metadata(resolved.value), namespace=NAMESPACE,
                                         log_to_driver=False, logging_level="ERROR")
            break
        except Exception as exc:  # noqa: BLE001 - Ray Client raises several types here
            error = _explain_connect_error(address, exc, local.temp_dir if local else None)
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
    anchor, versions = _start_session_anchor(context, lower_session_priority=local is not None)
    check_ray_supported(versions["ray"], "cluster")
    _check_versions(versions)
    _current_anchor = anchor
    _current = Cluster(address=address, kind=kind, ray_version=versions["ray"], python_version=versions["python"])
    _current_token = resolved.value
    say(f"Connected to {address} in {time.monotonic() - began:.1f} s")
    return _current


def disconnect() -> None:
    """Drop the connection. Runs keep going on the cluster; ``attach()`` gets them back.

    This session's warm workers exit. Calling it while not connected does nothing.

    Example::

        nbtrain.disconnect()
    """
    global _current, _current_token, _current_anchor
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _current = _current_token = _current_anchor = None


def session_anchor() -> Any:
    """The connected session's :class:`~nbtrain._cluster.warm.session_anchor.SessionAnchor` (a handle)."""
    current()
    return _current_anchor


def _default_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def check_connect_arguments(address: object, token: object) -> None:
    """Name the parameter and its expected form before anything is started or sent."""
    if address is not None and not isinstance(address, str):
        msg = (f"connect(address=...) must be a string like 'ray://head:10001' (the head node's Ray Client "
               f"port), or None for the embedded local cluster; got {type(address).__name__} {address!r}.")
        raise ConnectionFailedError(msg)
    if token is not None and not isinstance(token, str):
        msg = (f"connect(token=...) must be a string, the cluster's token (on the head: `ray get-auth-token`), "
               f"or None; got {type(token).__name__}.")
        raise ConnectionFailedError(msg)


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


def _explain_connect_error(address: str, exc: Exception, local_temp_dir: str | None = None) -> Exception:
    text = str(exc)
    cluster_ray = re.search(r"cluster was started with:\s*Ray: (\S+)", text)
    if cluster_ray:
        try:
            check_ray_supported(cluster_ray.group(1), "cluster")
        except VersionMismatchError as too_old:
            return too_old
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


def _embedded(address: str) -> local_cluster.LocalClusterInfo | None:
    """The embedded local cluster, when ``address`` is its (named by ``$RAY_ADDRESS`` too: same environment check)."""
    info = local_cluster.status()
    if info is None or info.address != address:
        return None
    local_head.check_environment(info)
    return info


def _start_session_anchor(context: Any, lower_session_priority: bool = False) -> tuple[Any, dict[str, str]]:
    """Start the session's actor on the cluster and ask it the versions a worker there sees.

    On the embedded cluster it also lowers the priority of this session's Ray Client
    server (see ``_priority``): only once the session is up, so connecting stays quick
    while a run trains. Where nbtrain cannot be imported on the cluster, the actor cannot
    start: the session's server fails to load its class (ImportError, measured with a class
    the head cannot import), or a worker does (a RayError naming the module). Ray and Python
    are then those the session's server (``context``) reported.
    """
    import ray

    from nbtrain._cluster.warm.session_anchor import SessionAnchor

    try:
        anchor = ray.remote(SessionAnchor).options(num_cpus=0).remote()
        versions: dict[str, str] = ray.get(anchor.versions.remote(lower_session_priority), timeout=120)
    except (ImportError, ray.exceptions.RayError) as exc:
        if "No module named 'nbtrain'" not in str(exc):
            raise
        versions = {"ray": context.ray_version, "python": context.python_version,
                    "nbtrain": "missing: No module named 'nbtrain'"}
        return None, versions
    return anchor, versions


def _check_versions(cluster: dict[str, str]) -> None:
    check_versions(cluster, {"ray": _ray_version(), "python": platform.python_version(), "nbtrain": __version__})


def check_ray_supported(version: str, side: str) -> None:
    """Refuse, on ``side`` ("notebook" or "cluster"), a Ray older than :data:`MIN_RAY` (it cannot be made
    safe) or outside the Ray releases nbtrain is tested with (``TESTED_RAY_MINORS``)."""
    try:
        release = Version(version).release
    except InvalidVersion:
        return  # not a version Ray publishes (a local build): nothing to judge by
    where = "in this notebook's environment" if side == "notebook" else "on the cluster"
    fix = ("in the kernel's environment and restart the kernel" if side == "notebook"
           else "on every node of the cluster and restart it")
    if release[:2] >= MIN_RAY:
        if ".".join(map(str, release[:2])) in TESTED_RAY_MINORS:
            return
        tested, newest = " and ".join(TESTED_RAY_MINORS), TESTED_RAY_MINORS[-1]
        msg = (f"Ray {version} {where} is not one nbtrain {__version__} is tested with (Ray {tested}): nbtrain "
               f"relies on Ray internals (Ray Train's seam, the raylet, the autoscaler's state) that a Ray release "
               f"may change. Install a tested Ray {fix}: `pip install \"ray[client,default]=={newest}.*\"`, "
               f"or an nbtrain release tested with Ray {version}.")
        raise VersionMismatchError(msg)
    minimum = ".".join(map(str, MIN_RAY))
    msg = (f"Ray {version} {where} is too old: nbtrain needs Ray >= {minimum}, because Ray before 2.52 "
           f"has no token authentication and in 2.52-2.53 the dashboard agent's HTTP job endpoint does "
           f"not check the token, so anyone who can reach that port can run code on the cluster. "
           f"Upgrade Ray {fix}: `pip install -U \"ray[client,default]>={minimum}\"`.")
    raise VersionMismatchError(msg)


def check_versions(cluster: dict[str, str], local: dict[str, str]) -> None:
    """Raise :class:`VersionMismatchError` naming both sides when Ray, Python (major.minor) or nbtrain differ."""
    problems = []
    if cluster["ray"] != local["ray"]:
        problems.append(f"Ray {local['ray']} in the notebook but Ray {cluster['ray']} on the cluster")
    if cluster["python"].split(".")[:2] != local["python"].split(".")[:2]:
        problems.append(f"Python {local['python']} in the notebook but Python {cluster['python']} on the cluster")
    if local.get("nbtrain") and not cluster.get("nbtrain", "").startswith("missing") \
            and cluster.get("nbtrain") and cluster["nbtrain"] != local["nbtrain"]:
        problems.append(f"nbtrain {local['nbtrain']} in the notebook but nbtrain {cluster['nbtrain']} on the cluster "
                        f"(the run's code and spec cross between them pickled)")
    if problems:
        msg = ("The notebook and the cluster run different versions: " + "; ".join(problems) +
               f". Install matching versions in the notebook's environment, "
               f"e.g. `pip install ray[client]=={cluster['ray']}`"
               + (f" and `pip install nbtrain=={cluster['nbtrain']}`" if "nbtrain" in " ".join(problems) else "")
               + ", or the notebook's versions on every node of the cluster.")
        raise VersionMismatchError(msg)
    if cluster.get("nbtrain", "").startswith("missing"):
        msg = (f"nbtrain cannot be imported on the cluster's nodes ({cluster['nbtrain']}). Install it there "
               "(`pip install nbtrain` in the image/nodes) so workers can run the training loop.")
        raise ConnectionFailedError(msg)
