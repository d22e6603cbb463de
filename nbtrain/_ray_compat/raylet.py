"""Worker processes and actors: the raylet's spare processes, a process's setup hook, an actor's identity."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


def prestart_worker(keep_alive_s: float, timeout_s: float) -> None:
    """Ask this node's raylet for one idle worker process of the caller's job and runtime env (its
    ``PrestartWorkers`` RPC); raises whatever the call raises.

    Public instead: none. Degrades: the caller (:func:`nbtrain._cluster.warm.spare_process.prestart_for_this_job`)
    says once on stderr that there is no spare process, and a relaunch's supervisor starts its own.
    """
    import ray
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
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=timeout_s)
    finally:
        channel.close()


def worker_setup_hook_env(hook: str) -> dict[str, str]:
    """Environment variables that make a Ray worker process call ``hook`` ("module.function") as it starts
    (the hook must never raise: Ray ends a process whose setup hook fails).

    Public instead: ``runtime_env={"worker_process_setup_hook": ...}``, which Ray applies to a job's
    processes only, not to one actor's. Degrades: ``{}`` where Ray no longer names the variable: the
    supervisor imports its code when it is created, as without a spare process (0.2 s of a relaunch).
    """
    try:
        from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    except ImportError:
        return {}
    return {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook}


def actor_key(handle: Any) -> Hashable:
    """What two handles of one actor have in common (one passed through Ray is another object).

    Public instead: the handle itself, where its class compares and hashes by actor id (Ray 2.60's
    ``ActorHandle`` does); else its ``_actor_id``. Degrades: else the object's identity: a warm worker
    given back by a run is ended instead of kept idle, and ``nbtrain.release_warm`` shows it without a pid.
    """
    kind: Any = type(handle)
    key: Hashable = handle
    if kind.__eq__ is object.__eq__ or kind.__hash__ is None:
        key = getattr(handle, "_actor_id", None) or id(handle)
    return key
