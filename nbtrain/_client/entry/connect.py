"""``connect()``, as users call it: the notebook's connection (:mod:`~nbtrain._client.connecting.connection`)
and, on the embedded cluster, the first run's ranks warmed while the notebook runs its next cells
(:mod:`~nbtrain._client.warm`).

Why here and not in the connection: warm workers belong to the connection's session (its warm pool), so they
can only be asked for once the session exists, and the pool's module builds on the connection's.
"""

from __future__ import annotations

from nbtrain._client import warm as warm_pool
from nbtrain._client.connecting import connection
from nbtrain._client.connecting.connection import Cluster, Progress
from nbtrain._client.kernel.progress_line import progress_line


def connect(address: str | None = None, *, token: str | None = None, num_cpus: int | None = None,
            num_gpus: int | None = None, progress: Progress | None = None,
            timeout: float = 120.0, warm: bool = True, warm_idle_s: float | None = None) -> Cluster:
    """Connect the notebook to a Ray cluster and return it.

    ``address`` is ``ray://host:port`` (the Ray Client port, 10001 by default), or, for a
    kernel that runs on a node of the cluster (JupyterLab on the head, a KubeRay or Anyscale
    workspace), the cluster's GCS address ``host:port`` (6379 by default) or ``"auto"`` (the
    cluster on this node, as ``ray.init("auto")`` finds it): the kernel then joins the cluster
    as a Ray driver, without Ray Client, and everything works as over Ray Client.
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
    environment variable (as a driver, Ray's own channels carry it: its token mode is on in the
    kernel until :func:`disconnect`, the environment unchanged).
    On the embedded cluster, as it returns, the first run's ranks start warming in the background
    (``RunOptions()``'s shape, as many as its first launch takes: their processes import torch while the
    notebook runs its next cells), and the connection's line says so; ``warm=False``, or
    ``$NBTRAIN_WARM_START=0`` for every kernel (``nbtrain lab --no-warm``), turns it off. They are idle warm
    workers (:func:`release_warm` ends them; see ``nbtrain cluster status`` for their memory).
    Needs the same Ray (2.54 to 2.60), Python and nbtrain in the notebook and on the cluster:
    a difference is said first, with the command that matches the notebook to the cluster
    (``pip install nbtrain "ray[client,default,train]==2.56.1"``).
    A cluster running Ray's own TLS (``RAY_USE_TLS=1``) is reached over TLS when the
    kernel's environment has ``RAY_USE_TLS=1`` and ``RAY_TLS_SERVER_CERT``,
    ``RAY_TLS_SERVER_KEY``, ``RAY_TLS_CA_CERT`` (its certificate, its key, the CA).

    Args:
        address: ``ray://host:port``, ``host:port`` (a GCS), ``"auto"``; ``None`` for ``$RAY_ADDRESS`` or the
            embedded cluster.
        token: the cluster's token (prefer ``$RAY_AUTH_TOKEN`` or a kept one in notebooks).
        num_cpus: CPUs of the embedded cluster when this call starts it (default: the machine's).
        num_gpus: GPUs of the embedded cluster when this call starts it.
        progress: called with each progress message (default: printed to stderr).
        timeout: seconds to wait for the cluster.
        warm: on the embedded cluster, warm the first run's ranks in the background.
        warm_idle_s: how long those ranks wait, idle, for a run (default: ``RunOptions.warm_idle_s``, 600 s).

    Returns:
        The connected :class:`Cluster`.

    Raises:
        ConnectionFailedError: the address cannot be reached, it refused the token, or TLS is on for
            only one side (or a TLS file is missing).
        VersionMismatchError: the notebook and the cluster run different Ray, Python or nbtrain.

    Example::

        cluster = nbtrain.connect()                      # local
        cluster = nbtrain.connect("ray://head:10001")     # remote, over Ray Client
        cluster = nbtrain.connect("auto")                 # a kernel on the cluster, as a Ray driver
    """
    say = progress or progress_line()
    last: list[str] = [""]

    def tell(message: str) -> None:
        last[0] = message
        say(message)

    before = connection.session_now()
    cluster = connection.connect(address, token=token, num_cpus=num_cpus, num_gpus=num_gpus, progress=tell,
                                 timeout=timeout)
    if cluster is not before and cluster.kind == "local" and warm_pool.warm_start_wanted(warm):
        cpus = cluster.resources().get("CPU", (0.0, 0.0))[1]
        ranks, options = warm_pool.warm_at_start(cpus, warm_idle_s)
        if ranks:
            say(f"{last[0]}; warming {ranks} ranks ({options.cpus_per_worker:g} CPU each) for the first run "
                "in the background (connect(warm=False) skips this)")
    return cluster
