"""A spare Ray worker process on the head node, so a launch's supervisor does not wait for one to start.

Every run has its own supervisor, a detached actor, and Ray gives a new detached
actor only a worker process that has never run anything else: each launch would
start a Python process and import Ray (seconds; most of a relaunch's time once
the rank processes are warm). Ray's raylet can start such processes ahead of need
for a job and keep them idle for a while (its ``PrestartWorkers`` call), with a
given runtime env: the one supervisors get (:func:`supervisor_runtime_env`), so that
only a supervisor takes it. ``connect()`` asks for one on the embedded cluster, for the session's
first launch (see :func:`~nbtrain._client.warm.warm_at_start`); each warm run has the session's warm
pool ask for the next launch's once its ranks are past their first step (a process asked for while
they start would take their CPU), or as its workers come back if it ended sooner (the pool asks: a
supervisor exits as its run ends, and a request sent just before lost its process). It is Ray's idle
process: no CPU is reserved, and Ray ends it after ``keep_alive_s`` or with the session's job.

The call is Ray's internal RPC: if it is missing or refused (another Ray version),
launches are as fast as they were without it, and nothing else changes.

A spare also imports the supervisor's code as it starts, before any supervisor
takes it (0.2 s of a relaunch otherwise): supervisors' runtime env names a
function of the supervisor's module as the process's setup hook, which Ray
imports that module to call. The hook also has Ray build the process's
serialization context, which Ray otherwise builds on the supervisor's first
arguments (importing pydantic for it: 0.1 to 0.23 s from the GCS leasing the process
to the constructor's first line, 8 to 15 ms once readied). Ray reads that hook from the job's runtime env
only, through one environment variable; :func:`nbtrain._ray_compat.worker_setup_hook_env`
sets it for the supervisors' own env. With a Ray that no longer reads it, the variable is inert
and the supervisor imports its code when created, as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import psutil

from nbtrain._ray_compat import prestart_worker, say_once, worker_setup_hook_env

RPC_TIMEOUT_S = 10.0
SUPERVISOR_SETUP_HOOK = "nbtrain._cluster.supervisor.supervisor._imported"  # importing its module is the point
SUPERVISOR_PROCESS = "run supervisor"  # NBTRAIN_PROCESS of supervisors' processes, their spares' too
SPARE_TITLE = "ray::IDLE"  # Ray's title for a worker process that runs nothing (yet)


def supervisor_runtime_env(holds: dict[str, Any] | None = None) -> dict[str, Any]:
    """A supervisor's runtime env (``holds``: its run's uploaded folders, see ``packages_to_hold``): what a spare
    process must have been started with for a supervisor to take it."""
    return {"env_vars": {"NBTRAIN_PROCESS": SUPERVISOR_PROCESS, **worker_setup_hook_env(SUPERVISOR_SETUP_HOOK)},
            **(holds or {})}


def prestart_for_supervisors(keep_alive_s: float) -> bool:
    """Ask this node's raylet for one idle worker process of the caller's job, in a supervisor's runtime env,
    unless one it asked for is still there: Ray starts a process for every ask, and runs that end without a
    launch after them (a sweep's trials, a notebook closed) would each leave one more idle (a second of CPU to
    start, about 100 MB kept)."""
    import ray

    if has_unused_spare(_worker_processes(), ray.get_runtime_context().get_job_id()):
        return True
    try:
        prestart_worker(keep_alive_s, RPC_TIMEOUT_S, supervisor_runtime_env())
    except Exception as exc:  # noqa: BLE001 - an optimisation: without it a launch starts its own process
        say_once(f"no spare process for the next supervisor ({type(exc).__name__}: {exc})")
        return False
    return True


def has_unused_spare(processes: Iterable[tuple[str, dict[str, str]]], job_id: str) -> bool:
    """Whether one of ``processes`` (each a worker process's title and environment) is a spare of job
    ``job_id`` no supervisor took: idle, or still starting (Python's own title until Ray names it)."""
    return any(environ.get("NBTRAIN_PROCESS") == SUPERVISOR_PROCESS and environ.get("RAY_JOB_ID") == job_id
               and (title == SPARE_TITLE or not title.startswith("ray::"))
               for title, environ in processes)


def _worker_processes() -> list[tuple[str, dict[str, str]]]:
    """This node's Ray worker processes (this one's siblings, under the raylet), as titles and environments."""
    found = []
    try:
        siblings = psutil.Process(os.getppid()).children()
    except psutil.Error:
        return []
    for process in siblings:
        try:
            found.append((" ".join(process.cmdline()).strip(), process.environ()))
        except psutil.Error:  # ended meanwhile
            continue
    return found
