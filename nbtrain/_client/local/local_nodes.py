"""Extra Ray nodes for the embedded local cluster, on the same machine: how a laptop user tries multi-node.

``nbtrain cluster add-node --cpus 2`` starts a second raylet that joins the
loopback head (:mod:`~nbtrain._client.local.local_node_process`: what ``ray start --address
--block`` does, every port on 127.0.0.1, the head's token); ``nbtrain cluster remove-node`` ends it as a real
node loss would look to a run (its workers die, Ray marks the node dead). Each
node runs in its own process session, like the head, so it is stopped by
signalling that process group, never with ``ray stop``. What was added is kept
in ``nodes.json`` beside ``local.json`` (:mod:`.added_nodes`); stopping the head removes them too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from nbtrain._client.local import local_cluster
from nbtrain._client.local.added_nodes import LocalNode, nodes, record
from nbtrain._client.local.process_sessions import kill_group
from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import LOOPBACK, free_port
from nbtrain._paths import local_cluster_dir, private_dir, private_opener

NODE_START_TIMEOUT_S = 60.0


def add(num_cpus: int, num_gpus: int | None = None, progress: local_cluster.Progress | None = None,
        timeout: float = NODE_START_TIMEOUT_S) -> LocalNode:
    """Start a node that joins the running local cluster; raises when there is none or it does not start."""
    say = progress or (lambda _msg: None)
    head = local_cluster.status()
    if head is None:
        raise ConnectionFailedError("No local Ray cluster is running to add a node to: start it first "
                                    "(`nbtrain cluster start`, or nbtrain.connect() in a notebook).")
    ports = {name: free_port() for name in ("node_manager", "object_manager", "dashboard_agent_listen",
                                            "metrics_agent", "metrics_export", "runtime_env_agent")}
    cmd = [sys.executable, "-m", "nbtrain._client.local.local_node_process",
           f"--gcs-address={LOOPBACK}:{head.gcs_port}", f"--num-cpus={num_cpus}", f"--ports={json.dumps(ports)}"]
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    log_path = private_dir(local_cluster_dir()) / f"node-{ports['node_manager']}.log"
    say(f"Adding a node with {num_cpus} CPUs to the local Ray cluster at {head.address}…")
    with open(log_path, "w", opener=private_opener) as log:
        proc = subprocess.Popen(cmd, env=local_cluster.ray_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=local_cluster.process_folder(), start_new_session=True)
    node = LocalNode(pid=proc.pid, num_cpus=num_cpus, num_gpus=num_gpus or 0,
                     node_manager_port=ports["node_manager"], log_path=str(log_path), started=time.time())
    deadline = time.monotonic() + timeout
    while not local_cluster.runtime_started(log_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc.pid)
            why = f"exited (code {proc.returncode})" if proc.returncode is not None else \
                f"did not start within {timeout:.0f} s"
            raise ConnectionFailedError(f"The added node {why}. Its output is in {log_path}:\n"
                                        f"{local_cluster.tail(log_path)}")
        time.sleep(0.25)
    record([*nodes(), node])
    say(f"Node added (pid {proc.pid}, {num_cpus} CPUs); `nbtrain cluster remove-node` removes it.")
    return node


def remove(pid: int | None = None) -> LocalNode | None:
    """End an added node (the newest when ``pid`` is None); None when there is no such node."""
    running = nodes()
    chosen = [n for n in running if pid is None or n.pid == pid]
    if not chosen:
        return None
    node = max(chosen, key=lambda n: n.started)
    kill_group(node.pid)
    record([n for n in running if n.pid != node.pid])
    return node
