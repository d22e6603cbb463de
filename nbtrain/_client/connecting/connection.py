"""Connecting the notebook to a Ray cluster: over Ray Client (``ray://host:10001``), or as a Ray driver of
a cluster whose node the kernel runs on (its GCS address ``host:6379``, or ``"auto"``); which an address
means is :mod:`nbtrain._client.connecting.cluster_address`'s to say. Runs are detached actors owned by the cluster,
so nothing of a run depends on how the notebook reached it: every feature works the same either way.

Before anything is started, the cluster is asked what it runs (its GCS's record, where this machine can
reach the GCS: a driver's address, the embedded cluster), and a Ray, Python or nbtrain that differs from
the notebook's is said first, both versions and the ``pip install`` that matches the notebook to it.

Which token, how it is sent (per connection, whatever was imported first) and
the fast check that names a dead address or a refused token live in
:mod:`nbtrain._client.connecting.auth`. Connecting records the cluster for the JupyterLab
sidebar once (:func:`nbtrain._registry.record_connection`); reading it never writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from nbtrain._client.connecting import auth, cluster_address, connect_errors, version_check
from nbtrain._client.connecting.cluster_address import ClusterAddress
from nbtrain._client.connecting.cluster_address import parse as parse_address
from nbtrain._client.connecting.version_check import check_ray_supported
from nbtrain._client.kernel.progress_line import progress_line
from nbtrain._client.local import local_cluster, local_head
from nbtrain._cluster.names import NAMESPACE
from nbtrain._exceptions import ConnectionFailedError, NotConnectedError, VersionMismatchError
from nbtrain._ray_compat import (
    client_session_lost,
    driver_token,
    forget_driver_token,
    init_driver,
    init_with_metadata,
    is_head_node,
    turn_off_auto_init,
)
from nbtrain._registry import record_connection

CONNECT_ATTEMPTS = 3
Progress = Callable[[str], None]


@dataclasses.dataclass
class Cluster:
    """The connected cluster, from :func:`connect`: its ``address`` (``ray://host:port`` over Ray Client,
    ``host:port`` for a driver), ``kind`` (``"local"`` for the embedded cluster, else ``"remote"``), the
    ``ray_version`` and ``python_version`` it runs, and ``via`` (``"client"`` or ``"driver"``). Its methods
    ask Ray now, so they need the connection to be live.

    Example::

        cluster = nbtrain.connect()
        cluster.resources()["CPU"]     # (used, total)
    """

    address: str
    kind: str
    ray_version: str
    python_version: str
    via: str = "client"

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


def session_now() -> Cluster | None:
    """The connection made last (even if lost since): a new object each time the notebook connects again."""
    return _current


def _ray_connected() -> bool:
    import ray

    return bool(ray.is_initialized()) and not client_session_lost()


def connect(address: str | None = None, *, token: str | None = None, num_cpus: int | None = None,
            num_gpus: int | None = None, progress: Progress | None = None,
            timeout: float = 120.0) -> Cluster:
    """The notebook's connection, told to the sidebar: :func:`nbtrain.connect` (in ``_client/entry``, which also
    warms the first run's ranks) says what each argument means."""
    say = progress or progress_line()
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
    check_ray_supported(version_check.notebook_versions()["ray"], "notebook")
    say = progress or _default_progress
    target, local = _target(address, num_cpus, num_gpus, say)
    kind = "local" if local else "remote"
    resolved = auth.resolve_token(token, target.text)
    if (_current is not None and _current.address == target.text and resolved.value == _current_token
            and _ray_connected()):
        return _current
    disconnect()
    began = time.monotonic()
    _check_cluster_first(target, local, resolved)
    if token and local is None:  # the cluster took it: later connections to this address find it
        auth.remember_token(target.text, token)
    if not target.driver:
        auth.check_kernel_ray(target.text)
    turn_off_auto_init()  # a Ray call while disconnected raises from now on, never starts a Ray here
    say(f"Connecting to {target.text} {target.mode}…")
    context = _open(target, resolved.value, local, timeout, say)
    if not target.driver:  # what the session's server runs, before anything is started there
        try:
            version_check.check_against_notebook({"ray": context.ray_version, "python": context.python_version})
        except VersionMismatchError:
            disconnect()
            raise
    anchor, versions = _start_session_anchor(context, lower_session_priority=local is not None and not target.driver,
                                             versions_known=local is not None and target.driver)
    check_ray_supported(versions["ray"], "cluster")
    version_check.check_against_notebook(versions)
    _current_anchor = anchor
    _current = Cluster(address=target.text, kind=kind, ray_version=versions["ray"], python_version=versions["python"],
                       via="driver" if target.driver else "client")
    _current_token = resolved.value
    say(f"Connected to {target.text} {target.mode} in {time.monotonic() - began:.1f} s")
    return _current


def _target(address: str | None, num_cpus: int | None, num_gpus: int | None,
            say: Progress) -> tuple[ClusterAddress, local_cluster.LocalClusterInfo | None]:
    """Where to connect and how (:mod:`~nbtrain._client.connecting.cluster_address`), and the embedded cluster's info
    when that is where (also when ``$RAY_ADDRESS`` or an explicit address names it: Binder, `nbtrain lab`)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address.strip().lower() in ("local", "auto-local"):
        address = None
    if address is None:
        info = local_cluster.start(num_cpus=num_cpus, num_gpus=num_gpus, progress=say)
        target = parse_address(info.connect_address)
    elif address.strip().lower() == "auto":
        target = cluster_address.on_this_node()
    else:
        target = parse_address(address)
    return target, _embedded(target.text)


def _check_cluster_first(target: ClusterAddress, local: local_cluster.LocalClusterInfo | None,
                         resolved: auth.ResolvedToken) -> None:
    """Before anything is started: the address answers, takes the token, and runs this Ray and Python.

    A GCS (a driver's address, or the embedded cluster's, whose GCS this machine reaches) says what it
    runs in one call; over Ray Client to another machine, the GCS beside its server where the head keeps the
    default ports (:func:`~nbtrain._client.connecting.auth.versions_beside`), else the session's server once started.
    """
    if target.driver:
        metadata = auth.preflight_gcs(target, resolved.value, source=resolved.source, withheld=resolved.withheld)
    else:
        auth.preflight(target.text, target.host, target.port, resolved.value, source=resolved.source,
                       withheld=resolved.withheld)
        # a shortcut only: the session's server says the same 2-3 s later
        if local is not None:
            metadata = {}
            with contextlib.suppress(ConnectionFailedError):
                metadata = auth.preflight_gcs(parse_address(local.gcs_address), resolved.value)
        else:
            metadata = auth.versions_beside(target, resolved.value)
    if metadata.get("ray_version") and metadata.get("python_version"):
        check_ray_supported(str(metadata["ray_version"]), "cluster")
        version_check.check_against_notebook({"ray": str(metadata["ray_version"]),
                                              "python": str(metadata["python_version"])})


def _open(target: ClusterAddress, token: str | None, local: local_cluster.LocalClusterInfo | None,
          timeout: float, say: Progress) -> Any:
    """``ray.init`` for ``target``: once as a driver; over Ray Client, up to :data:`CONNECT_ATTEMPTS` times."""
    import ray

    if target.driver:
        try:
            with driver_token(token):
                return init_driver(target.text, target.node_ip_address, namespace=NAMESPACE, log_to_driver=False,
                                   logging_level="ERROR")
        except Exception as exc:  # noqa: BLE001 - Ray raises several types here
            forget_driver_token()
            raise connect_errors.explain(target.text, exc) from None
    began = time.monotonic()
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            return init_with_metadata(target.text, auth.grpc_metadata(token), namespace=NAMESPACE,
                                      log_to_driver=False, logging_level="ERROR")
        except Exception as exc:  # noqa: BLE001 - Ray Client raises several types here
            error = connect_errors.explain(target.text, exc, local.temp_dir if local else None)
            # The preflight proved the server answers. Ray Client starts one server process per
            # session; on a busy head that start occasionally fails and a new session succeeds.
            # On a busy 2-core head one session start takes 20-45 s, so the budget allows 3 of them.
            out_of_time = time.monotonic() - began > timeout
            if attempt == CONNECT_ATTEMPTS or out_of_time or isinstance(error, VersionMismatchError):
                raise error from None
            if ray.is_initialized():
                ray.shutdown()
            say(f"Connecting to {target.text} failed ({type(exc).__name__}); "
                f"trying again ({attempt + 1}/{CONNECT_ATTEMPTS})…")
            time.sleep(2.0 * attempt)
    raise AssertionError("unreachable")


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
    forget_driver_token()  # a driver's token leaves this process's Ray with the connection
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
               f"port), 'head:6379' or 'auto' (a kernel on the cluster), or None for the embedded local cluster; "
               f"got {type(address).__name__} {address!r}.")
        raise ConnectionFailedError(msg)
    if token is not None and not isinstance(token, str):
        msg = (f"connect(token=...) must be a string, the cluster's token (on the head: `ray get-auth-token`), "
               f"or None; got {type(token).__name__}.")
        raise ConnectionFailedError(msg)


def _embedded(address: str) -> local_cluster.LocalClusterInfo | None:
    """The embedded local cluster, when ``address`` is its (its Ray Client or GCS address, named by
    ``$RAY_ADDRESS`` too: same environment check)."""
    info = local_cluster.status()
    if info is None or address not in info.addresses:
        return None
    local_head.check_environment(info)
    return info


def _start_session_anchor(context: Any, lower_session_priority: bool = False,
                          versions_known: bool = False) -> tuple[Any, dict[str, str]]:
    """Start the session's actor on the cluster and ask it the versions a worker there sees.

    ``versions_known``: the notebook joins the embedded cluster as a driver, whose head this environment
    started (``local_head.check_environment`` refused any other): its workers run this Ray, Python and
    nbtrain, and nothing is asked of the actor, so ``connect()`` does not wait for its process to start
    (0.3 s of a Run All's path on a 2-core machine).

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
        if versions_known:
            return anchor, version_check.notebook_versions()
        versions: dict[str, str] = ray.get(anchor.versions.remote(lower_session_priority), timeout=120)
    except (ImportError, ray.exceptions.RayError) as exc:
        if "No module named 'nbtrain'" not in str(exc):
            raise
        mine = version_check.notebook_versions()  # a driver's context has no such fields: the same Ray as here
        versions = {"ray": getattr(context, "ray_version", mine["ray"]),
                    "python": getattr(context, "python_version", mine["python"]),
                    "nbtrain": "missing: No module named 'nbtrain'"}
        return None, versions
    return anchor, versions
