"""Short tasks on the cluster's head node, from the notebook: a run or sweep whose supervisor has exited is read from
its files there.

:func:`on_head` runs a function of the cluster side (:mod:`nbtrain._cluster.supervisor.stored_run`, the sweeps'
records) in a Ray task on the head node and waits for its answer. The task takes no CPU in Ray's accounting, so it
runs even while training ranks hold every core, and no process is kept. On the embedded cluster the function runs
in the notebook's process instead: the head is this machine, its files this home's. :func:`stored_names` and
:func:`stored_summaries` list the runs the head keeps files of; :func:`is_stored` and :func:`stored_summary` ask of
one. It sits below ``_client/launching`` (an ended run's name gives a new run ``NAME-2``; a resume takes up its
files) and ``_client/run`` (a finished run's handle, :mod:`~nbtrain._client.run.stored`), which both read it and
neither of which it imports.
"""

from __future__ import annotations

import functools
from typing import Any

from nbtrain._client.connecting import connection
from nbtrain._cluster.supervisor import stored_run
from nbtrain._ray_compat import on_head_node

ANSWER_S = 60.0  # a head task reads a few files; past this the head is not answering


@functools.cache
def head_task(function: Any) -> Any:
    """``function`` as a Ray remote function that runs on the head node and holds no CPU."""
    import ray

    return ray.remote(function).options(num_cpus=0, max_retries=0, resources=on_head_node())


def on_head(function: Any, *args: Any) -> Any:
    """Run ``function(*args)`` in a task on the head node and return its value; on the embedded cluster, here:
    its head is this machine and its files this home's, and a task would wait for a worker process to start
    (seconds on a just-started cluster, in front of a first launch's name check)."""
    import ray

    if connection.current().kind == "local":
        return function(*args)
    return ray.get(head_task(function).remote(*args), timeout=ANSWER_S)


def is_stored(name: str) -> bool:
    """Whether the head keeps files of a run named ``name``."""
    return on_head(stored_run.indexed_directory, name) is not None


def stored_summary(name: str) -> dict[str, Any]:
    """The run ``name`` summed up from its files, as its supervisor would."""
    summary: dict[str, Any] = on_head(stored_run.read_stored, name, "summary", (), {})
    return summary


def stored_summaries(exclude: list[str]) -> list[dict[str, Any]]:
    """The summaries of the runs the head keeps files of, but those named in ``exclude``."""
    summaries: list[dict[str, Any]] = on_head(stored_run.stored_summaries, exclude)
    return summaries


def stored_names() -> list[str]:
    """The names in the head's run index: every run it keeps files of, ended or not."""
    names: list[str] = on_head(stored_run.indexed_names)
    return names
