"""The nodes added to this home's local cluster (``nodes.json`` beside ``local.json``): what
``nbtrain cluster add-node`` started, read by ``nbtrain cluster`` and ended with the head.

Its own module so that stopping the head (:mod:`.local_cluster`) ends the added nodes without
importing what starts them (:mod:`.local_nodes`, which builds on the head's module).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from nbtrain._client.local.process_sessions import kill_group, pid_alive
from nbtrain._paths import local_cluster_dir, read_json, write_json_atomic


@dataclasses.dataclass(frozen=True)
class LocalNode:
    """A node added to the local cluster: its ``ray start --block`` process and what it offers."""

    pid: int
    num_cpus: int
    num_gpus: int
    node_manager_port: int   # tells its raylet apart from the head's in `ray.nodes()`
    log_path: str
    started: float


def nodes_file() -> Path:
    return local_cluster_dir() / "nodes.json"


def nodes() -> list[LocalNode]:
    """The nodes added to this home's local cluster that are still running (reading writes nothing:
    ``add`` and ``remove`` rewrite the record without the ones that ended)."""
    return [LocalNode(**entry) for entry in read_json(nodes_file()) or [] if pid_alive(entry["pid"])]


def record(running: list[LocalNode]) -> None:
    write_json_atomic(nodes_file(), [dataclasses.asdict(node) for node in running])


def remove_all() -> int:
    """End every added node (the head is stopping); how many there were."""
    running = nodes()
    for node in running:
        kill_group(node.pid)
    nodes_file().unlink(missing_ok=True)
    return len(running)
