"""Room for Ray Data beside the ranks, decided before a run with ``datasets=`` starts.

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


def cluster_cpus() -> float:
    """The CPUs of the cluster's live nodes (what Ray could ever give the run and its data)."""
    import ray

    return float(sum(node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node["Alive"]))
