"""A worker node joined to the loopback head from Python (what ``ray start --address --block`` does)."""

from __future__ import annotations

from typing import Any


def start_worker_node(gcs_address: str, num_cpus: int, num_gpus: int | None, ports: dict[str, int]) -> Any:
    """Start a raylet, object store and agents bound to 127.0.0.1 that join ``gcs_address`` with the head's
    token; returns the node, for :func:`stop_node`.

    Public instead: ``ray start --address``, which with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` refuses to
    join and with 1 cannot reach a loopback head (see :mod:`nbtrain._client.local.local_node_process`).
    Degrades: the node process exits with Ray's error, and adding a local node fails showing its output;
    ``tests/test_multi_node.py`` pins it.
    """
    import ray._private.node
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._private.parameter import RayParams

    params = RayParams(
        node_ip_address="127.0.0.1", gcs_address=gcs_address, num_cpus=num_cpus, num_gpus=num_gpus,
        min_worker_port=0, max_worker_port=0, node_manager_port=ports["node_manager"],
        object_manager_port=ports["object_manager"], dashboard_agent_listen_port=ports["dashboard_agent_listen"],
        metrics_agent_port=ports["metrics_agent"], metrics_export_port=ports["metrics_export"],
        runtime_env_agent_port=ports["runtime_env_agent"], include_log_monitor=False,
    )
    ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    return ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)


def stop_node(node: Any) -> None:
    """End the processes of a node :func:`start_worker_node` started (its raylet leaves the cluster).

    Public instead: as for :func:`start_worker_node`. Degrades: the node process exits with the error and
    Ray's reaper, started with the node, ends what it leaves.
    """
    node.kill_all_processes(check_alive=False, allow_graceful=True)
