"""What the cluster's control store (the GCS) says: free resources per node, draining nodes, the autoscaler's
standing request, the jobs' driver processes; and the one write, a node's drain."""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

from nbtrain._ray_compat.notice import reason, say_once


class Draining(NamedTuple):
    """The nodes Ray reports as draining, or none and why Ray's node state could not be read."""

    nodes: frozenset[str]
    unreadable: str = ""  # empty when the nodes were read


def draining_nodes() -> Draining:
    """The live nodes Ray reports as draining (a preemption notice from the cloud, the autoscaler, or a
    raylet told to stop): each node's state snapshot in the GCS node table.

    Public instead: autoscaler v2's status (``ray.autoscaler.v2.sdk.get_cluster_status``, nodes whose
    status is ``DRAINING``), read when the node table cannot be (the node table is read first: it is
    what ``tests/test_elastic.py`` pins). Degrades: never raises; no nodes and the reason, which an
    elastic run says once in its events while it keeps its size.
    """
    try:
        return Draining(_draining_from_node_table())
    except Exception as exc:  # noqa: BLE001 - a probe: a failure is reported, never raised
        first = reason(exc)
    try:
        return Draining(_draining_from_autoscaler_status())
    except Exception as exc:  # noqa: BLE001 - as above
        return Draining(frozenset(), f"{first}; autoscaler status: {reason(exc)}")


def _draining_from_node_table() -> frozenset[str]:
    import ray
    from ray.core.generated import gcs_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    draining = gcs_pb2.NodeSnapshot.State.Value("DRAINING")
    return frozenset(node_id.hex() for node_id, info in gcs.get_all_node_info().items()
                     if info.state == gcs_pb2.GcsNodeInfo.ALIVE and info.state_snapshot.state == draining)


def _draining_from_autoscaler_status() -> frozenset[str]:
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(ray.get_runtime_context().gcs_address)
    return frozenset(str(node.node_id) for node in status.active_nodes + status.idle_nodes
                     if node.node_status == "DRAINING" and node.node_id)


def free_resources_outside(nodes: set[str]) -> dict[str, float]:
    """The cluster's free resources, not counting those of ``nodes``.

    Public instead: none per node in Ray 2.60 without the dashboard (``ray.available_resources()`` is the
    sum). Degrades: where the per-node view cannot be read, the sum less all of ``nodes``' resources
    (``ray.nodes()``), said once on the supervisor's stderr: a run leaving a draining node may shrink
    further than it had to, never onto the node.
    """
    import ray

    try:
        per_node = ray._private.state.available_resources_per_node()
    except Exception as exc:  # noqa: BLE001 - a probe: fall back to the public sum
        say_once(f"cannot read Ray's free resources per node ({reason(exc)}); counting draining nodes as full")
        free = dict(ray.available_resources())
        for node in ray.nodes():
            if node["Alive"] and node["NodeID"] in nodes:
                for key, amount in node.get("Resources", {}).items():
                    free[key] = max(0.0, free.get(key, 0.0) - amount)
        return free
    free = {}
    for node_id, resources in per_node.items():
        if node_id not in nodes:
            for key, amount in resources.items():
                free[key] = free.get(key, 0.0) + amount
    return free


def drain_node(node_id: str, why: str, deadline_s: float) -> tuple[bool, str]:
    """Tell Ray that ``node_id`` is about to go (a preemption): (accepted, Ray's reason when it refused).

    Public instead: none in Python (``ray drain-node`` is the same call from a shell). Degrades:
    ``run.drain()`` raises the error, so the user sees it; the run itself goes on untouched.
    """
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    accepted, refusal = gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,
                                       why, int((time.time() + deadline_s) * 1000))
    return bool(accepted), str(refusal)


def standing_request() -> list[dict[str, float]]:
    """The cluster's standing ``request_resources`` bundles, where its autoscaler reads them: v2 from the
    GCS's resource constraints, v1 from a key of the GCS's internal KV store.

    Public instead: autoscaler v2's status (``get_cluster_status``'s cluster constraint demand), first;
    v1 has none. Degrades: raises; an elastic run then says in its events that it could not withdraw
    its request of the autoscaler.
    """
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if not is_autoscaler_v2():
        from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
        from ray.experimental.internal_kv import _internal_kv_get

        stored = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        return [dict(bundle) for bundle in json.loads(stored)] if stored else []
    import ray

    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        demands = get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands
        return [dict(by_count.bundle) for constraint in demands.cluster_constraint_demand
                for by_count in constraint.bundles_by_count for _ in range(by_count.count)]
    except Exception as exc:  # noqa: BLE001 - the public status failed: the GCS's own reply, as Ray reads it
        say_once(f"cannot read autoscaler v2's status ({reason(exc)}); reading the GCS's resource state")
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    state = get_cluster_resource_state(ray._private.worker.global_worker.gcs_client)
    return [dict(by_count.request.resources_bundle)
            for constraint in state.cluster_resource_constraints
            for by_count in constraint.resource_requests
            for _ in range(by_count.count)]


def driver_pid(job_id: str) -> int | None:
    """The pid of job ``job_id``'s driver (for a Ray Client session, the session's server), if known.

    Public instead: ``ray.util.state.list_jobs`` (asks the dashboard, which the embedded cluster runs
    without), when the job table cannot be read. Degrades: None, said once on stderr: the session's
    server keeps its CPU priority (ranks may lose a few percent of throughput on a laptop).
    """
    import ray

    try:
        jobs: list[dict[str, Any]] = ray._private.state.jobs()
        return next((int(job["DriverPid"]) for job in jobs if job["JobID"] == job_id and job["DriverPid"]), None)
    except Exception as exc:  # noqa: BLE001 - a convenience: try the public listing
        first = reason(exc)
    try:
        from ray.util.state import list_jobs

        pids = [job.driver_info.pid for job in list_jobs(detail=True) if job.job_id == job_id and job.driver_info]
        return int(pids[0]) if pids and pids[0] else None
    except Exception as exc:  # noqa: BLE001 - as above
        say_once(f"cannot find the Ray Client session's server ({first}; list_jobs: {reason(exc)}): "
                 f"it keeps its CPU priority")
        return None
