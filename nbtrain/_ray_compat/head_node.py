"""The head node, as Ray marks it: the custom resource ``node:__internal_head__``.

nbtrain pins a run's bookkeeping (supervisors, sweep supervisors, the warm pool, reads of stored runs)
to the head with it and tells the head apart in ``ray.nodes()``. Used in every process.
"""

from __future__ import annotations

from typing import Any

HEAD_NODE_RESOURCE = "node:__internal_head__"


def on_head_node() -> dict[str, float]:
    """Ray ``resources=`` that place an actor or task on the head node (a sliver: it takes no slot).

    Public instead: none that works without the dashboard in Ray 2.60 (``ray.util.state.list_nodes``'
    ``is_head_node`` asks the dashboard, which the embedded cluster runs without; Ray sets no head label).
    Degrades: on a Ray that stops giving the head this resource, a supervisor never places, and
    ``launch()`` times out saying the run stayed pending.
    """
    return {HEAD_NODE_RESOURCE: 0.001}


def is_head_node(node: dict[str, Any]) -> bool:
    """Whether an entry of ``ray.nodes()`` is the head node.

    Public instead: as for :func:`on_head_node`. Degrades: no node is the head, so ``Cluster.nodes()``
    marks none and ``run.drain(node=...)`` naming the head is not refused before Ray is asked.
    """
    return HEAD_NODE_RESOURCE in node.get("Resources", {})
