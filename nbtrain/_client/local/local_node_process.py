"""The process of a node added to the local cluster: ``python -m nbtrain._client.local.local_node_process``.

Why not ``ray start --address``: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
(what keeps every Ray socket on 127.0.0.1) ``ray start`` refuses to join a
cluster, and with it set to 1 it rewrites the head's address 127.0.0.1 to the
machine's network address and cannot reach the loopback head. So this does
what ``ray start --address --block`` does for a worker node, through the same
``ray._private.node.Node`` (private, pinned by ``tests/test_multi_node.py``),
with the variable left at 0: the node's raylet, object store and agents bind
127.0.0.1, and it uses the head's token. It says "Ray runtime started" once
up, and on SIGTERM ends its processes (its raylet leaves the cluster: to a run
with ranks there, a lost node).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gcs-address", required=True)
    parser.add_argument("--num-cpus", type=int, required=True)
    parser.add_argument("--num-gpus", type=int, default=None)
    parser.add_argument("--ports", required=True, help="JSON: node_manager, object_manager, dashboard_agent_listen, "
                                                        "metrics_agent, metrics_export, runtime_env_agent")
    args = parser.parse_args(argv)
    ports = json.loads(args.ports)

    import ray._private.node
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._private.parameter import RayParams

    params = RayParams(
        node_ip_address="127.0.0.1", gcs_address=args.gcs_address, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
        min_worker_port=0, max_worker_port=0, node_manager_port=ports["node_manager"],
        object_manager_port=ports["object_manager"], dashboard_agent_listen_port=ports["dashboard_agent_listen"],
        metrics_agent_port=ports["metrics_agent"], metrics_export_port=ports["metrics_export"],
        runtime_env_agent_port=ports["runtime_env_agent"], include_log_monitor=False,
    )
    ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print("Ray runtime started.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    node.kill_all_processes(check_alive=False, allow_graceful=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
