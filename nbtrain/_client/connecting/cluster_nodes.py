"""The cluster's nodes as a user names them: a Ray node id, or its first characters."""

from __future__ import annotations

from nbtrain._exceptions import NbtrainError
from nbtrain._ray_compat import is_head_node

MIN_PREFIX = 6  # the worker table shows a node's first 6 characters


def worker_node_id(node: str, caller: str) -> str:
    """The full id of the live, non-head node ``node`` names; an error saying what to give otherwise."""
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    matches = [n for n in nodes if isinstance(node, str) and len(node) >= MIN_PREFIX and n["NodeID"].startswith(node)]
    if len(matches) != 1:
        what = "matches several nodes" if matches else "is no live node of the cluster"
        shown = ", ".join(n["NodeID"][:MIN_PREFIX] for n in nodes)
        msg = (f"{caller}: {node!r} {what}; give a node's Ray id or its first {MIN_PREFIX}+ characters "
               f"(live nodes: {shown}).")
        raise NbtrainError(msg)
    if is_head_node(matches[0]):
        msg = (f"{caller}: {node!r} is the head node, which holds the runs' supervisors and the cluster itself; "
               f"name a worker node.")
        raise NbtrainError(msg)
    return str(matches[0]["NodeID"])
