"""The notebook session's own actor on the cluster, started when the notebook connects.

The session (the Ray Client connection) owns it, so it lives exactly as long as that
session: kernel restart, ``disconnect()`` or a lost connection end it. Connecting asks
it what the cluster runs (Ray, Python, nbtrain; not when the notebook joins the embedded
cluster as a driver: that head runs this environment, and connect() does not wait for this
process) and, on the embedded cluster over Ray Client, has it lower the priority of the
session's Ray Client server; the session's warm pool holds a call
to it that never returns (:meth:`SessionAnchor.until_gone`) and learns the session has ended when
that call fails (:mod:`nbtrain._cluster.warm.warm_pool`). One process
does both jobs because a Ray worker process costs about 1.5 CPU-seconds to start, on the
cores a laptop's ranks need: a probe of its own at connect made every session that went
on to launch a run start one process more, and wait for it.
"""

from __future__ import annotations

import asyncio


class SessionAnchor:
    """Owned by the notebook's session, so it lives exactly as long as that session."""

    async def until_gone(self) -> None:
        """Never returns: the warm pool waits on this call, which fails the moment this actor dies with its
        session. A ping every second cost the pool and this actor 2-3 % of a core each, idle, for the
        session's whole life (on the laptop cores its ranks need)."""
        await asyncio.Event().wait()

    def versions(self, lower_session_priority: bool) -> dict[str, str]:
        """Ray, Python and nbtrain as a worker on the cluster sees them; with ``lower_session_priority``
        (the embedded cluster, once the session is up) it also lowers its session server's priority."""
        import platform

        import ray

        from nbtrain._cluster.priority import lower_session_server_priority
        from nbtrain._version import __version__

        if lower_session_priority:
            lower_session_server_priority()
        return {"ray": ray.__version__, "python": platform.python_version(), "nbtrain": __version__}
