"""The process of a node added to the local cluster: ``python -m nbtrain._client.local.local_node_process``.

Why not ``ray start --address``: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
(what keeps every Ray socket on 127.0.0.1) ``ray start`` refuses to join a
cluster, and with it set to 1 it rewrites the head's address 127.0.0.1 to the
machine's network address and cannot reach the loopback head. So this does
what ``ray start --address --block`` does for a worker node, through the same
node class Ray's command uses (:func:`nbtrain._ray_compat.start_worker_node`),
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

    from nbtrain._ray_compat import start_worker_node, stop_node

    node = start_worker_node(args.gcs_address, args.num_cpus, args.num_gpus, ports)
    print("Ray runtime started.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    stop_node(node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
