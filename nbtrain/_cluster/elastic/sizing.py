"""How many ranks an elastic run (``workers=(min, max)``) should have, and why it changes.

An elastic run's world size is fixed within an attempt and changes between
attempts, each resuming from the latest checkpoint: it starts with as many
ranks as fit (at least ``min``), **shrinks** when a node with some of its ranks
is lost (the failure then costs no ``max_failures`` as long as ``min`` ranks
fit), and **grows** toward ``max`` when a check every ``resize_interval_s``
finds room: the ranks are asked for a checkpoint (``nbtrain.checkpoint_requested()``
turns true), and the attempt ends at the next one. The same code serves the
supervisor's decisions and its events, so what the user reads is what was decided.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import ray

from nbtrain._exceptions import NbtrainError
from nbtrain._options import RunOptions
from nbtrain._ray_compat import drain_node as ray_drain_node
from nbtrain._ray_compat import free_resources_outside, standing_request

RESOURCES_FREED_S = 5.0  # how long Ray may take to mark a lost node dead after its workers' errors


def scaling(options: RunOptions, world_size: int) -> tuple[float, float]:
    """(batch factor, learning-rate factor) for the ranks of an attempt of ``world_size`` ranks.

    The batch size and learning rate in the code are the ones for ``min`` ranks. By default the
    global batch stays that of ``min`` ranks: each rank's ``prepare_loader`` batch is scaled by
    ``min / world_size`` (never above what the code asked for, so a rank never needs more memory),
    and the optimisation follows the same trajectory. ``scale_lr="linear"`` keeps each rank's
    batch, so the global batch grows with the world size, and scales ``prepare_optimizer``'s
    learning rate by ``world_size / min`` (Goyal et al., 2017, "Accurate, Large Minibatch SGD");
    ``"sqrt"`` by its square root (Krizhevsky, 2014, "One weird trick"; the rule for Adam-like
    optimisers).
    """
    if not options.elastic:
        return 1.0, 1.0
    ratio = world_size / options.min_workers
    if options.scale_lr is None:
        return 1.0 / ratio, 1.0
    return 1.0, ratio if options.scale_lr == "linear" else math.sqrt(ratio)


def room_for(options: RunOptions, held: int = 0, leaving: set[str] | None = None) -> int:
    """How many of this run's bundles the cluster could place now, counting the ``held`` ones it has
    and not the free resources of ``leaving`` nodes (draining: nothing new goes there)."""
    free = free_resources_outside(leaving) if leaving else ray.available_resources()
    by_cpu = math.floor(free.get("CPU", 0.0) / options.cpus_per_worker + 1e-9)
    by_gpu = math.floor(free.get("GPU", 0.0) / options.gpus_per_worker + 1e-9) if options.gpus_per_worker \
        else by_cpu
    return held + max(0, int(min(by_cpu, by_gpu)))


def starting_size(options: RunOptions) -> int:
    """The world size of a new attempt: fixed, or as many as fit between min and max."""
    if not options.elastic:
        return options.max_workers
    return max(options.min_workers, min(options.max_workers, room_for(options)))


def room_after_shutdown(options: RunOptions) -> int:
    """The size an attempt could restart at, just after the last one's group was removed (Ray frees a
    placement group's resources a moment after its removal: looked at until ``min`` fit, briefly)."""
    deadline = time.monotonic() + RESOURCES_FREED_S
    while True:
        size = min(options.max_workers, room_for(options))
        if size >= options.min_workers or time.monotonic() > deadline:
            return size
        time.sleep(0.25)


def drain_node(node_id: str, deadline_s: float) -> None:
    """Tell Ray that ``node_id`` is about to go (a preemption notice): it schedules nothing new there, its
    resources leave the cluster's free ones, and the node exits once idle or at the deadline."""
    accepted, why = ray_drain_node(node_id, "nbtrain: run.drain()", deadline_s)
    if not accepted:
        raise NbtrainError(f"Ray refused to drain node {node_id[:6]}: {why}")


def bundle(options: RunOptions) -> dict[str, float]:
    """One rank's reservation."""
    return {"CPU": options.cpus_per_worker, **({"GPU": options.gpus_per_worker} if options.gpus_per_worker else {})}


def ask_autoscaler(options: RunOptions, size: int) -> list[dict[str, float]]:
    """On an autoscaling cluster, ask for room for ``max`` ranks (Ray counts what the run already holds).

    ``request_resources`` is one standing request for the whole cluster (each call replaces the
    last): the run asks while it is below ``max`` and withdraws (:func:`withdraw_request`) only
    a request that is still its own. Returns what was asked ([] when at ``max``).
    """
    from ray.autoscaler.sdk import request_resources

    if size >= options.max_workers:
        return []
    asked = [bundle(options)] * options.max_workers
    request_resources(bundles=asked)
    return asked


def withdraw_request(asked: list[dict[str, float]]) -> None:
    """Clear the cluster's standing request if it is still the one this run made."""
    from ray.autoscaler.sdk import request_resources

    if asked and standing_request() == asked:
        request_resources(bundles=[])


class GrowthWatch:
    """An elastic attempt's periodic look for room to grow, and the pending resize until its checkpoint arrives."""

    def __init__(self, options: RunOptions, size: int) -> None:
        self.options = options
        self.size = size
        self.target: int | None = None        # set while the ranks are asked for a checkpoint
        self._asked_after: Any = None          # the checkpoint that was latest when they were asked
        self.why = ""                          # the resize's reason, as the events and the header say it
        self._next_look = time.monotonic() + options.resize_interval_s

    def request(self, target: int, latest_checkpoint: Any, why: str) -> None:
        """Ask for a checkpoint to go on at ``target`` ranks from it (a node draining)."""
        self.target, self._asked_after, self.why = target, latest_checkpoint, why

    def look(self, latest_checkpoint: Any, room_now: Callable[[], int]) -> int | None:
        """A bigger size worth growing to (once per interval; None otherwise). Starts the checkpoint request.
        ``room_now``: the bundles the cluster could place, these ranks' included (:func:`room_for`)."""
        if self.target is not None or self.size >= self.options.max_workers:
            return None
        if time.monotonic() < self._next_look:
            return None
        self._next_look = time.monotonic() + self.options.resize_interval_s
        room = min(self.options.max_workers, room_now())
        if room <= self.size:
            return None
        self.request(room, latest_checkpoint, f"{self.size} → {room} ranks: resources freed up")
        return room

    def ready(self, latest_checkpoint: Any) -> bool:
        """A checkpoint newer than the request has arrived: time to end the attempt and grow."""
        return self.target is not None and latest_checkpoint is not None and latest_checkpoint is not self._asked_after

    @property
    def checkpoint_wanted(self) -> bool:
        return self.target is not None
