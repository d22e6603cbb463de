"""A spare Ray worker process on the head node, so a relaunch's supervisor does not wait for one to start.

Every run has its own supervisor, a detached actor, and Ray gives a new detached
actor only a worker process that has never run anything else: each launch would
start a Python process and import Ray (seconds; most of a relaunch's time once
the rank processes are warm). Ray's raylet can start such processes ahead of need
for a job and keep them idle for a while (its ``PrestartWorkers`` call). The
supervisor of a run with warm workers, once started (on the head node, in the
notebook session's job), asks for one; the next launch's supervisor takes it. It
is Ray's idle process: no CPU is reserved, and Ray ends it after ``keep_alive_s``
or with the session's job.

The call is Ray's internal RPC: if it is missing or refused (another Ray version),
launches are as fast as they were without it, and nothing else changes.

A spare also imports the supervisor's code as it starts, before any supervisor
takes it (0.2 s of a relaunch otherwise): supervisors' runtime env names a
function of the supervisor's module as the process's setup hook, which Ray
imports that module to call. Ray reads that hook from the job's runtime env
only, through one environment variable; :func:`nbtrain._ray_compat.worker_setup_hook_env`
sets it for the supervisors' own env. With a Ray that no longer reads it, the variable is inert
and the supervisor imports its code when created, as before.
"""

from __future__ import annotations

from nbtrain._ray_compat import prestart_worker, say_once

RPC_TIMEOUT_S = 10.0


def prestart_for_this_job(keep_alive_s: float) -> bool:
    """Ask this node's raylet for one idle worker process of the caller's job and runtime env."""
    try:
        prestart_worker(keep_alive_s, RPC_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - an optimisation: without it a launch starts its own process
        say_once(f"no spare process for the next supervisor ({type(exc).__name__}: {exc})")
        return False
    return True

