"""Reaching a finished run, whose supervisor has exited, from the notebook.

A :class:`StoredRunHandle` looks like the supervisor's actor handle to
:class:`~nbtrain._client.run.handle.Run` (``handle.poll.remote(...)`` returns an object
ref) but each call is a short-lived Ray task on the head node that reads the
run's files (:mod:`nbtrain._cluster.supervisor.stored_run`), by :mod:`nbtrain._client.connecting.head_tasks`: no
process is kept for the run.
"""

from __future__ import annotations

from typing import Any

from nbtrain._client.connecting.head_tasks import head_task, is_stored
from nbtrain._cluster.supervisor import stored_run

READ_TIMEOUT_S = 60.0  # a read of a run, from its supervisor or its files


class _StoredMethod:
    def __init__(self, name: str, method: str) -> None:
        self._name = name
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return head_task(stored_run.read_stored).remote(self._name, self._method, args, kwargs)


class StoredRunHandle:
    """Stands in for a run's supervisor handle once the supervisor has exited."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def answers(method: str) -> bool:
        """Whether an ended run's files answer ``method`` (a command's results, say, need a live run)."""
        return callable(getattr(stored_run.StoredRun, method, None))

    def __getattr__(self, method: str) -> _StoredMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _StoredMethod(self.name, method)


def find_stored(name: str) -> StoredRunHandle | None:
    """A handle on the stored run ``name``, or ``None`` if the cluster has no files of it."""
    return StoredRunHandle(name) if is_stored(name) else None
