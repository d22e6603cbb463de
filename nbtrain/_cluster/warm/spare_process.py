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
only, through one environment variable; :func:`preload_env` sets it for the
supervisors' own env. With a Ray that no longer reads it, the variable is inert
and the supervisor imports its code when created, as before.
"""

from __future__ import annotations

import sys

import ray

RPC_TIMEOUT_S = 10.0
_said: set[str] = set()  # what failed, said once per process


def prestart_for_this_job(keep_alive_s: float) -> bool:
    """Ask this node's raylet for one idle worker process of the caller's job and runtime env."""
    try:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

        context = ray.get_runtime_context()
        node = next(n for n in ray.nodes() if n["NodeID"] == context.get_node_id())
        request = node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.PYTHON, job_id=bytes.fromhex(context.get_job_id()), num_workers=1,
            keep_alive_duration_secs=max(int(keep_alive_s), 1))
        # the caller's own runtime env: Ray gives a process only to work of the same env
        request.runtime_env_info.serialized_runtime_env = context.get_runtime_env_string()
        channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
        try:
            node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=RPC_TIMEOUT_S)
        finally:
            channel.close()
    except Exception as exc:  # noqa: BLE001 - an optimisation: without it a launch starts its own process
        reason = f"{type(exc).__name__}: {exc}"
        if reason not in _said:
            _said.add(reason)
            sys.stderr.write(f"nbtrain: no spare process for the next supervisor ({reason})\n")
        return False
    return True


def preload_env(hook: str) -> dict[str, str]:
    """Environment variables that make a Ray worker process call ``hook`` ("module.function") as it
    starts. The hook must never raise: Ray ends a process whose setup hook fails."""
    try:
        from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    except ImportError:
        return {}
    return {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook}
