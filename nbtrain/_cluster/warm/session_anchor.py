"""The notebook session's own actor on the cluster, started when the notebook connects.

The session (the Ray Client connection) owns it, so it lives exactly as long as that
session: kernel restart, ``disconnect()`` or a lost connection end it. Connecting asks
it what the cluster runs (Ray, Python, nbtrain) and, on the embedded cluster, has it
lower the priority of the session's Ray Client server; the session's warm pool pings it
to learn when the session has ended (:mod:`nbtrain._cluster.warm.warm_pool`). One process
does both jobs because a Ray worker process costs about 1.5 CPU-seconds to start, on the
cores a laptop's ranks need: a probe of its own at connect made every session that went
on to launch a run start one process more, and wait for it.
"""

from __future__ import annotations


class SessionAnchor:
    """Owned by the notebook's session, so it lives exactly as long as that session."""

    def ping(self) -> bool:
        return True

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
