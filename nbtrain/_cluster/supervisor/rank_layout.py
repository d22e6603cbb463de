"""Local ranks, node ranks and GPU visibility for each rank, from where Ray placed the workers."""

from __future__ import annotations

from typing import Any


def layout_ranks(places: list[dict[str, Any]], gpus_per_worker: float) -> list[dict[str, Any]]:
    """One entry per rank: ``local_rank``, ``local_world_size``, ``node_rank``, ``gpu_index``,
    ``cuda_visible_devices`` and ``device_name``.

    As torchrun does, every rank on a node sees all of that node's GPUs given
    to the run (``CUDA_VISIBLE_DEVICES``) and uses the one Ray assigned it, by
    index — NCCL then finds its peers on the node.
    """
    by_node: dict[str, list[int]] = {}
    for rank, place in enumerate(places):
        by_node.setdefault(place["node_id"], []).append(rank)
    node_order = list(by_node)
    layout = []
    for rank, place in enumerate(places):
        node_ranks = by_node[place["node_id"]]
        gpu_index = None
        visible = None
        if gpus_per_worker > 0:
            node_gpus = sorted({g for r in node_ranks for g in places[r]["gpu_ids"]}, key=_gpu_sort_key)
            visible = ",".join(node_gpus)
            gpu_index = node_gpus.index(place["gpu_ids"][0]) if place["gpu_ids"] else 0
        layout.append({
            "local_rank": node_ranks.index(rank), "local_world_size": len(node_ranks),
            "node_rank": node_order.index(place["node_id"]), "gpu_index": gpu_index,
            "cuda_visible_devices": visible,
            "device_name": f"cuda:{gpu_index}" if gpu_index is not None else "cpu",
        })
    return layout


def _gpu_sort_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), gpu_id) if gpu_id.isdigit() else (1 << 30, gpu_id)
