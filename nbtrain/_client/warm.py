"""The notebook session's side of warm workers (see :mod:`nbtrain._cluster.warm.warm_pool`).

The first launch that wants warm workers makes this connection's pool, tied to
the session by the anchor made when it connected; later launches name the same
pool in their spec. ``release_warm()`` ends this session's idle workers; ``warm_pools()`` lists
every session's, for ``%ray_status`` and the sidebar.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import TYPE_CHECKING, Any

from nbtrain._client.connecting import connection
from nbtrain._cluster.names import NAMESPACE, POOL_PREFIX, pool_name
from nbtrain._ray_compat import on_head_node

if TYPE_CHECKING:
    from nbtrain._options import RunOptions

DESCRIBE_TIMEOUT_S = 10.0
WARM_START_ENV = "NBTRAIN_WARM_START"  # "0": connect() warms no ranks (as connect(warm=False))


@dataclasses.dataclass
class _SessionPool:
    cluster: connection.Cluster  # the connection it belongs to: a new connection is a new session
    name: str
    pool: Any


_made: _SessionPool | None = None


def pool_for_launch() -> str:
    """The actor name of this session's warm pool, made on first use."""
    import ray

    from nbtrain._cluster.warm.warm_pool import WarmPool

    global _made
    cluster = connection.current()
    if _made is None or _made.cluster is not cluster:
        name = pool_name(uuid.uuid4().hex[:12])
        pool = ray.remote(WarmPool).options(
            name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_concurrency=16,
            resources=on_head_node(),
        ).remote(connection.session_anchor())
        _made = _SessionPool(cluster, name, pool)
    return _made.name


def pool_for(options: RunOptions) -> str | None:
    """The pool a run with these options leases its workers from (a sweep's trials too); None for
    ``warm=False`` and for an elastic run (its size changes as it goes: it starts and ends its own workers)."""
    if not options.warm or options.elastic:
        return None
    return pool_for_launch()


def prestart(pool: str | None, options: RunOptions, workers: int | None = None) -> None:
    """Ask ``pool`` for the first workers of a run with these options (see ``WarmPool.prestart``): ``workers``
    in the background (no launch waits for them yet), else as many as its supervisor will start with
    (:func:`~nbtrain._cluster.elastic.sizing.starting_size` decides it for both)."""
    from nbtrain._cluster.elastic.sizing import starting_size
    from nbtrain._cluster.warm.warm_pool import shape_of

    if pool is None:
        return
    assert _made is not None and _made.name == pool
    count = starting_size(options) if workers is None else workers
    _made.pool.prestart.remote(shape_of(options), count, options.warm_idle_s, workers is not None)


def warm_start_wanted(asked: bool) -> bool:
    """Whether ``connect()`` warms the first run's ranks: asked for (its default) and not turned off for every
    kernel by ``$NBTRAIN_WARM_START=0`` (``nbtrain lab --no-warm`` sets it for its kernels)."""
    return asked and os.environ.get(WARM_START_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def warm_at_start(cluster_cpus: float, idle_s: float | None = None) -> tuple[int, RunOptions]:
    """Start idle workers of the default shape (``RunOptions()``: what ``%%ray_train`` with no flags asks
    for), as many as its first launch takes and the cluster holds, so that launch finds them ready: their
    processes start, import torch and its lazy parts while the notebook runs its next cells. Returns how
    many and the options they are for; an idle process for that launch's supervisor is asked for first (see
:mod:`~nbtrain._cluster.warm.spare_process`). The ranks are this session's pool's workers like any other: they end after
    ``idle_s`` (default: the options' ``warm_idle_s``), with ``release_warm()``, or when a run of another shape
    leases from the pool."""
    from nbtrain._cluster.elastic.sizing import starting_size
    from nbtrain._options import RunOptions

    options = RunOptions() if idle_s is None else RunOptions(warm_idle_s=idle_s)
    workers = min(starting_size(options), int(cluster_cpus // max(float(options.cpus_per_worker), 1e-9)))
    if workers < 1:
        return 0, options
    prestart(pool_for_launch(), options, workers)  # and the first launch's supervisor's process
    return workers, options


def release_warm() -> int:
    """End this notebook session's idle warm workers now (they would otherwise wait ``warm_idle_s``
    for the next run of their shape). Runs going on are not touched.

    Returns:
        How many idle workers ended (0 when not connected or none were idle).

    Example::

        nbtrain.release_warm()
    """
    import ray

    if _made is None or _made.cluster is not connection.current():
        return 0
    try:
        return int(ray.get(_made.pool.release.remote(), timeout=DESCRIBE_TIMEOUT_S))
    except ray.exceptions.RayActorError:
        return 0


def warm_pools() -> dict[str, list[dict[str, Any]]]:
    """Every notebook session's warm workers on the cluster: pool name -> its workers (``describe()``)."""
    import ray

    connection.current()
    names = [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
             if actor["namespace"] == NAMESPACE and actor["name"].startswith(POOL_PREFIX)]
    found: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        try:
            pool = ray.get_actor(name, namespace=NAMESPACE)
            found[name] = ray.get(pool.describe.remote(), timeout=DESCRIBE_TIMEOUT_S)
        except (ValueError, ray.exceptions.RayError):
            continue  # exiting as we asked
    return found


def is_this_session(name: str) -> bool:
    return _made is not None and _made.name == name
