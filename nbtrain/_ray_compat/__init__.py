"""Every use nbtrain makes of Ray's private or internal APIs, in one place (issue 36).

Nothing else in ``nbtrain`` imports ``ray._private``, ``ray._raylet``, ``ray.core.generated``,
``ray.experimental.internal_kv`` or ``ray.train.v2._internal``, or reads a private attribute of a Ray
object: ``tests/test_ray_compat.py`` enforces it. Each entry's docstring says what it is for, which
public API it uses instead where the running Ray has one, and what degrades, visibly, when it fails.
A probe that fails never fails a run.

Entry (module): the Ray internal it uses -> the public API it uses first, or what is left when it fails.

head_node (every process)
  ``HEAD_NODE_RESOURCE``, ``on_head_node``, ``is_head_node``: the head's resource ``node:__internal_head__``
  -> none that works without the dashboard.
client (the notebook's kernel)
  ``init_with_metadata``: ``ray.init(_metadata=...)``, the token's header -> none.
  ``kernel_ray_lacks_token``: ``ray._raylet``'s token loader -> none; the check is skipped.
  ``ping_client_server``: Ray Client's protos (``ray.core.generated``) -> none; the ping is skipped.
  ``turn_off_auto_init``: ``ray._private.auto_init_hook`` -> ``RAY_ENABLE_AUTO_CONNECT`` (read at import only).
local_node (an added local node's process)
  ``start_worker_node``, ``stop_node``: ``ray._private.node.Node``, ``RayParams``,
  ``ensure_token_if_auth_enabled`` -> ``ray start --address`` (cannot join a loopback head).
raylet (the supervisor, the warm pool)
  ``prestart_worker``: the raylet's ``PrestartWorkers`` RPC -> none; no spare process.
  ``worker_setup_hook_env``: ``WORKER_PROCESS_SETUP_HOOK_ENV_VAR`` -> none; ``{}``.
  ``actor_key``: ``ActorHandle._actor_id`` -> the handle's own ``==`` and hash.
cluster_state (the supervisor, a session's anchor)
  ``draining_nodes`` (-> ``Draining``): the GCS node table's state snapshots -> autoscaler v2's status;
  else no nodes and the reason (an elastic run keeps its size and says so once).
  ``free_resources_outside``: ``ray._private.state.available_resources_per_node`` ->
  ``ray.available_resources()`` less the nodes' whole resources.
  ``drain_node``: ``gcs_client.drain_node`` -> none (``ray drain-node`` from a shell).
  ``standing_request``: the internal KV (autoscaler v1), the GCS's resource state (v2) -> autoscaler v2's
  status on v2 clusters.
  ``driver_pid``: ``ray._private.state.jobs()`` -> ``ray.util.state.list_jobs`` (needs the dashboard).
runtime_env (the notebook's kernel)
  ``upload_local_paths``: ``ray._private.runtime_env``'s upload of ``working_dir``/``py_modules`` -> none
  (Ray Client uploads only its own ``ray.init(runtime_env=)``); a failed upload refuses the launch.
ray_train (the ranks; imported by the seam alone, not re-exported here)
  ``TrainFnUtils``, ``set_train_fn_utils``, ``LocalTrainContext``: Ray Train v2's ``_internal`` seam ->
  none; an untested Ray gets an error naming the Ray to install.

A fallback that is taken says so once per process on stderr (:func:`say_once`): the actor's log on the
cluster, the cell's output in the kernel.
"""

from __future__ import annotations

from nbtrain._ray_compat.client import (
    init_with_metadata,
    kernel_ray_lacks_token,
    ping_client_server,
    turn_off_auto_init,
)
from nbtrain._ray_compat.cluster_state import (
    Draining,
    drain_node,
    draining_nodes,
    driver_pid,
    free_resources_outside,
    standing_request,
)
from nbtrain._ray_compat.head_node import HEAD_NODE_RESOURCE, is_head_node, on_head_node
from nbtrain._ray_compat.local_node import start_worker_node, stop_node
from nbtrain._ray_compat.notice import say_once
from nbtrain._ray_compat.raylet import actor_key, prestart_worker, worker_setup_hook_env
from nbtrain._ray_compat.runtime_env import upload_local_paths

__all__ = [
    "HEAD_NODE_RESOURCE",
    "Draining",
    "actor_key",
    "drain_node",
    "draining_nodes",
    "driver_pid",
    "free_resources_outside",
    "init_with_metadata",
    "is_head_node",
    "kernel_ray_lacks_token",
    "on_head_node",
    "ping_client_server",
    "prestart_worker",
    "say_once",
    "standing_request",
    "start_worker_node",
    "stop_node",
    "turn_off_auto_init",
    "upload_local_paths",
    "worker_setup_hook_env",
]
