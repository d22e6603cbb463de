"""Reaching a finished run, whose supervisor has exited, from the notebook.

A :class:`StoredRunHandle` looks like the supervisor's actor handle to
:class:`~nbtrain._client.run.handle.Run` (``handle.poll.remote(...)`` returns an object
ref) but each call is a short-lived Ray task on the head node that reads the
run's files (:mod:`nbtrain._cluster.run.stored_run`). The task takes no CPU in
Ray's accounting, so it runs even while training ranks hold every core, and
no process is kept for the run.
"""

from __future__ import annotations

import functools
from typing import Any

from nbtrain._cluster.run import stored_run
from nbtrain._ray_compat import on_head_node

READ_TIMEOUT_S = 60.0


@functools.cache
def _task(function: Any) -> Any:
    import ray

    return ray.remote(function).options(num_cpus=0, max_retries=0, resources=on_head_node())


def on_head(function: Any, *args: Any) -> Any:
    """Run ``function(*args)`` in a task on the head node and return its value."""
    import ray

    return ray.get(_task(function).remote(*args), timeout=READ_TIMEOUT_S)


class _StoredMethod:
    def __init__(self, name: str, method: str) -> None:
        self._name = name
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return _task(stored_run.read_stored).remote(self._name, self._method, args, kwargs)


class StoredRunHandle:
    """Stands in for a run's supervisor handle once the supervisor has exited."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, method: str) -> _StoredMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _StoredMethod(self.name, method)


def find_stored(name: str) -> StoredRunHandle | None:
    """A handle on the stored run ``name``, or ``None`` if the cluster has no files of it."""
    if on_head(stored_run.indexed_directory, name) is None:
        return None
    return StoredRunHandle(name)


def stored_summaries(exclude: list[str]) -> list[dict[str, Any]]:
    summaries: list[dict[str, Any]] = on_head(stored_run.stored_summaries, exclude)
    return summaries


def stored_names() -> list[str]:
    names: list[str] = on_head(stored_run.indexed_names)
    return names
