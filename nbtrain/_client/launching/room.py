"""Room on the cluster for a run, decided once before it starts: its ranks fit, with Ray Data beside them.

A request the cluster can never hold is refused at once, listing what the cluster has (a placement group
would otherwise wait for ever). A run with ``datasets=`` also leaves Ray Data a CPU:
Ray Data reads and transforms (``map_batches``) as Ray tasks that each ask for one CPU (its
default). A run's placement group reserves ``workers * cpus_per_worker`` CPUs for its whole life;
when that is every CPU the cluster has — two ranks on a 2-core laptop or a Binder box — no Data
task is ever scheduled and the ranks wait at step 0 for shards that never come (Ray Train has the
same trap: its workers' bundles take the CPUs, and it reserves nothing for Data).

nbtrain leaves Data one CPU. When the ranks would take more than the cluster's CPUs less one, their
bundles shrink to share what is left: ``(cluster CPUs - 1) / workers`` each. That is a reservation,
not a limit — Ray does not cap a process's CPU use, so a rank computes as before and Data's tasks
share the cores with it, as they would beside any other process. The run's events and the
``launch()`` caller's log say so. Where even that leaves nothing (a 1-CPU cluster), the run is
refused before it starts, with what to do.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from nbtrain._exceptions import ResourcesUnavailableError
from nbtrain._options import RunOptions

DATA_CPUS = 1.0          # one Ray Data task at a time: its default num_cpus
SMALLEST_RANK_SHARE = 0.05  # below this a rank's reservation is a rounding error: refuse instead


def leave_room_for_data(options: RunOptions, cluster_cpus: float) -> tuple[RunOptions, str | None]:
    """``options`` of a run with ``datasets=``, with ranks that leave Ray Data a CPU on a cluster of
    ``cluster_cpus``, and the note that says what changed (``None`` when nothing had to)."""
    workers = options.max_workers
    reserved = workers * options.cpus_per_worker
    if reserved <= cluster_cpus - DATA_CPUS + 1e-9:
        return options, None
    share = (cluster_cpus - DATA_CPUS) / workers
    if share < SMALLEST_RANK_SHARE:
        msg = (f"datasets=: Ray Data's read and map tasks need {DATA_CPUS:g} CPU beside the {workers} ranks, and "
               f"this cluster has {cluster_cpus:g} CPU in all. Add CPUs (nbtrain.connect(num_cpus=...) for the "
               "embedded cluster, or a node), or load the data in the training function with prepare_loader "
               "instead of datasets=.")
        raise ResourcesUnavailableError(msg)
    share = float(f"{share:.3g}")
    note = (f"Ray Data needs a CPU for its tasks beside the ranks: each of the {workers} ranks reserves "
            f"{share:g} CPU instead of {options.cpus_per_worker:g} on this {cluster_cpus:g}-CPU cluster "
            "(a reservation, not a limit: the ranks still use every core)")
    return dataclasses.replace(options, cpus_per_worker=share), note


def make_room(options: RunOptions, with_data: bool) -> tuple[RunOptions, str | None]:
    """``options`` whose ranks the cluster can hold (leaving Ray Data a CPU ``with_data``), and the note that
    says what changed; refuses a run that cannot fit at all. One look at the cluster's nodes."""
    nodes = [node for node in _nodes() if node["Alive"]]
    note = None
    if with_data:
        options, note = leave_room_for_data(options, float(sum(n["Resources"].get("CPU", 0.0) for n in nodes)))
    check_resources(nodes, options.min_workers, options.cpus_per_worker, options.gpus_per_worker)
    return options, note


def check_resources(nodes: list[dict[str, Any]], workers: int, cpus_per_worker: float,
                    gpus_per_worker: float) -> None:
    """Refuse at once a request ``nodes`` (Ray's live nodes) can never hold, listing what they have."""
    total_cpu = sum(n["Resources"].get("CPU", 0) for n in nodes)
    total_gpu = sum(n["Resources"].get("GPU", 0) for n in nodes)
    per_node = [(n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in nodes]
    fits_per_node = sum(min(math.floor(c / cpus_per_worker + 1e-9),
                            math.floor(g / gpus_per_worker + 1e-9) if gpus_per_worker else 1 << 30)
                        for c, g in per_node)
    if fits_per_node >= workers:
        return
    picture = "; ".join(f"node {n['NodeManagerAddress']}: {c:g} CPU, {g:g} GPU"
                        for n, (c, g) in zip(nodes, per_node))
    want = f"{workers} workers × ({cpus_per_worker:g} CPU, {gpus_per_worker:g} GPU)"
    need = f"{workers * cpus_per_worker:g} CPU and {workers * gpus_per_worker:g} GPU"
    if gpus_per_worker and total_gpu == 0:
        hint = "--gpus-per-worker 0 (this cluster has no GPUs)"
    elif gpus_per_worker:
        hint = f"at most {int(total_gpu // gpus_per_worker)} workers with {gpus_per_worker:g} GPU each"
    else:
        hint = f"at most {fits_per_node} workers with {cpus_per_worker:g} CPU each, or fewer CPUs per worker"
    msg = (f"The cluster cannot hold {want} = {need}: it has {total_cpu:g} CPU and {total_gpu:g} GPU in all "
           f"({picture}), room for {fits_per_node} such worker(s). Ask for {hint}, or add nodes.")
    raise ResourcesUnavailableError(msg)


def _nodes() -> list[dict[str, Any]]:
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()
    return nodes
