"""Ray's internals that nbtrain leans on, declared here once each (the rest still live where they are
used; moving them all here is issue 36's first item).

The head node: Ray gives it the custom resource ``node:__internal_head__``, which is how nbtrain pins
the run's bookkeeping (supervisors, sweep supervisors, the warm pool, reads of stored runs) to the head
and tells the head apart in ``ray.nodes()``. Used in every process.
"""

from __future__ import annotations

from typing import Any

HEAD_NODE_RESOURCE = "node:__internal_head__"


def on_head_node() -> dict[str, float]:
    """Ray ``resources=`` that place an actor or task on the head node (a sliver: it takes no slot)."""
    return {HEAD_NODE_RESOURCE: 0.001}


def is_head_node(node: dict[str, Any]) -> bool:
    """Whether an entry of ``ray.nodes()`` is the head node."""
    return HEAD_NODE_RESOURCE in node.get("Resources", {})
