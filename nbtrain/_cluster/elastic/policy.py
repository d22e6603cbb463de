"""How big a run's next attempt is, and when an attempt should end to change it: the sizing policy.

The run's controller (:mod:`nbtrain._cluster.supervisor.controller`) asks its policy at
four points, as Ray Train v2's controller asks its scaling policy, and knows
nothing of nodes, room or autoscalers itself:

* :meth:`~SizingPolicy.attempt_size`, as an attempt starts: its world size
  (below ``max``, an autoscaling cluster is also asked for room);
* :meth:`~SizingPolicy.tick`, at each watch tick: a :class:`Resize` when the
  attempt should end at the checkpoint just taken (room to grow, a node draining);
* :meth:`~SizingPolicy.after_failure`: a :class:`Resize` when ranks died with
  their node and ``min`` ranks still fit (a shrink: no failure counted);
* :meth:`~SizingPolicy.end`, as the run ends: the autoscaler request withdrawn.

:class:`FixedSize` answers for a run of fixed size, :class:`ElasticPolicy` for
``workers=(min, max)`` (the rules are in :mod:`.sizing`). Both read the cluster
through a :class:`Cluster`: Ray's (:class:`RayCluster`), or a unit test's fake.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import ray

from nbtrain._cluster.elastic import sizing
from nbtrain._exceptions import NbtrainError
from nbtrain._options import RunOptions
from nbtrain._ray_compat import Draining, draining_nodes

DRAIN_LOOK_S = 1.0  # how often an elastic attempt looks for its ranks' nodes draining
NODE_DEATH_NOTICE_S = 10.0  # how long a rank's death may precede Ray marking its node dead

Say = Callable[[str, str], None]  # an event on the run's feed: (kind, message)


@dataclasses.dataclass(frozen=True)
class Resize:
    """An elastic run ends the attempt to go on at another world size (from the checkpoint just taken)."""

    size: int
    why: str


class Ranks(Protocol):
    """What a policy reads of the attempt's ranks (the supervisor's worker table)."""

    def snapshot(self) -> list[dict[str, Any]]: ...

    def all_pushed_after(self, moment: float) -> bool: ...


class Cluster(Protocol):
    """What a policy asks of the cluster."""

    def starting_size(self, options: RunOptions) -> int: ...

    def room(self, options: RunOptions, held: int, leaving: set[str]) -> int: ...

    def room_after_shutdown(self, options: RunOptions) -> int: ...

    def lost_nodes(self, suspects: set[str]) -> set[str]: ...

    def draining(self) -> Draining: ...

    def drain(self, node_id: str, deadline_s: float) -> None: ...

    def ask(self, options: RunOptions, size: int) -> list[dict[str, float]]: ...

    def withdraw(self, asked: list[dict[str, float]]) -> None: ...


class RayCluster:
    """The cluster as Ray tells it."""

    def starting_size(self, options: RunOptions) -> int:
        return sizing.starting_size(options)

    def room(self, options: RunOptions, held: int, leaving: set[str]) -> int:
        return sizing.room_for(options, held=held, leaving=leaving)

    def room_after_shutdown(self, options: RunOptions) -> int:
        return sizing.room_after_shutdown(options)

    def lost_nodes(self, suspects: set[str]) -> set[str]:
        """Which of ``suspects`` (nodes of ranks that died) Ray has marked dead; waits a little for it to notice."""
        deadline = time.monotonic() + NODE_DEATH_NOTICE_S
        while True:
            alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
            dead = suspects - alive
            if dead or time.monotonic() > deadline:
                return dead
            time.sleep(0.5)

    def draining(self) -> Draining:
        return draining_nodes()

    def drain(self, node_id: str, deadline_s: float) -> None:
        sizing.drain_node(node_id, deadline_s)

    def ask(self, options: RunOptions, size: int) -> list[dict[str, float]]:
        return sizing.ask_autoscaler(options, size)

    def withdraw(self, asked: list[dict[str, float]]) -> None:
        sizing.withdraw_request(asked)


class SizingPolicy(Protocol):
    def attempt_size(self, attempt: int) -> int: ...

    def tick(self, checkpoint: dict[str, Any] | None, ranks: Ranks) -> Resize | None: ...

    def after_failure(self, died_on: dict[str, str]) -> Resize | None: ...

    def not_placed(self, size: int, waited_s: float) -> Resize | None: ...

    def resize(self, resize: Resize) -> None: ...

    def drain(self, node_id: str, deadline_s: float, ranks: Ranks) -> str: ...

    def checkpoint_wanted(self, attempt: int) -> bool: ...

    def end(self) -> None: ...


def for_run(options: RunOptions, cluster: Cluster, say: Say) -> SizingPolicy:
    """The policy for a run with these options."""
    return ElasticPolicy(options, cluster, say) if options.elastic else FixedSize(options)


class FixedSize:
    """A run of fixed size: every attempt has ``max`` ranks, and only a failure ends one."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options

    def attempt_size(self, attempt: int) -> int:
        return self.options.max_workers

    def tick(self, checkpoint: dict[str, Any] | None, ranks: Ranks) -> Resize | None:
        return None

    def after_failure(self, died_on: dict[str, str]) -> Resize | None:
        return None

    def not_placed(self, size: int, waited_s: float) -> Resize | None:
        return None  # a fixed size waits out placement_timeout_s for its ranks

    def resize(self, resize: Resize) -> None:
        msg = f"a run of fixed size ({self.options.max_workers} ranks) does not resize"
        raise NbtrainError(msg)

    def drain(self, node_id: str, deadline_s: float, ranks: Ranks) -> str:
        msg = (f"run.drain() needs an elastic run (workers=(min, max)): run {self.options.name!r} has a fixed "
               f"size of {self.options.max_workers}; give it max_failures to restart from its checkpoint when a "
               f"node goes, or launch it with workers=(min, max).")
        raise NbtrainError(msg)

    def checkpoint_wanted(self, attempt: int) -> bool:
        return False

    def end(self) -> None:
        return None


class ElasticPolicy:
    """``workers=(min, max)``: start with what fits, shrink when a node is lost, move off a draining node at a
    checkpoint, grow toward ``max`` when room appears, and keep an autoscaler request while below ``max``."""

    def __init__(self, options: RunOptions, cluster: Cluster, say: Say) -> None:
        self.options = options
        self._cluster = cluster
        self._say = say
        self._attempt = 0
        self._size = 0
        self._next_size: int | None = None         # the next attempt's size, when decided
        self._growth: sizing.GrowthWatch | None = None
        self._drained: set[str] = set()            # nodes drained with run.drain(): leaving, whatever Ray says
        self._next_drain_look = 0.0
        self._said_unreadable = False              # said once that Ray's node state cannot be read
        self._asked: list[dict[str, float]] = []   # this run's standing request to the autoscaler
        self._unplaced: tuple[int, int] | None = None  # a size that was not placed, and the room counted then

    def attempt_size(self, attempt: int) -> int:
        size = self._next_size or self._cluster.starting_size(self.options)
        self._attempt, self._size, self._next_size = attempt, size, None
        self._growth = sizing.GrowthWatch(self.options, size)
        self._ask_autoscaler(size)
        return size

    def resize(self, resize: Resize) -> None:
        self._next_size = resize.size

    def after_failure(self, died_on: dict[str, str]) -> Resize | None:
        """The smaller size to go on at when ranks died with their node (``died_on``: node id → name), if
        ``min`` ranks fit; None for any other failure (it counts against ``max_failures``)."""
        if not died_on:
            return None
        lost = self._cluster.lost_nodes(set(died_on))
        if not lost:
            return None
        size = self._cluster.room_after_shutdown(self.options)
        if size < self.options.min_workers:
            return None
        names = ", ".join(sorted({died_on[node] for node in lost}))
        return Resize(size, f"{self._size} → {size} ranks: lost node {names}")

    def not_placed(self, size: int, waited_s: float) -> Resize | None:
        """The attempt's ``size`` was not placed within ``waited_s``: the room it was read from went to someone
        else (two runs asking at once would each wait for the other's), or the placement strategy cannot use it.
        It starts with ``min``, which is what the run asks to be sure of, and grows at a checkpoint once the
        cluster has more room than it counts now (see ``_room_to_grow``)."""
        low = self.options.min_workers
        if size <= low:
            return None
        self._unplaced = (size, self._cluster.room(self.options, 0, self._leaving()))
        return Resize(low, f"{size} ranks were not placed within {waited_s:.0f} s (the room counted a moment before "
                           "was taken, or the placement strategy cannot use it): starting with "
                           f"{low}, growing when more room appears")

    def drain(self, node_id: str, deadline_s: float, ranks: Ranks) -> str:
        """Preemption notice for ``node_id``: Ray stops placing work there, the ranks are asked for a
        checkpoint (at the next tick), and the run goes on from it without the node."""
        on_node = [w["rank"] for w in ranks.snapshot() if w.get("node_id") == node_id]
        self._cluster.drain(node_id, deadline_s)
        self._drained.add(node_id)
        self._next_drain_look = 0.0
        where = f"ranks {', '.join(map(str, on_node))} checkpoint, then the run goes on without it" if on_node \
            else "none of this attempt's ranks is there"
        self._say("drain", f"node {node_id[:6]} draining: {where}")
        return f"Node {node_id[:6]} is draining: {where}."

    def checkpoint_wanted(self, attempt: int) -> bool:
        """Whether the ranks of ``attempt`` should checkpoint now (to resize at it)."""
        growth = self._growth
        return growth is not None and attempt == self._attempt and growth.checkpoint_wanted

    def end(self) -> None:
        if self._asked:
            self._ask_autoscaler(self.options.max_workers)  # at max: withdraws the request

    def tick(self, checkpoint: dict[str, Any] | None, ranks: Ranks) -> Resize | None:
        """A draining node's ranks, or room to grow, ask the ranks for a checkpoint; the attempt ends at it
        once every row the ranks reported before it is in."""
        growth = self._growth
        if growth is None:
            return None
        self._drain_check(growth, checkpoint, ranks)
        target = growth.look(checkpoint, lambda: self._room_to_grow(growth.size))
        if target is not None:
            self._say("resize", f"room for {target} ranks (now {growth.size}): growing at the next checkpoint")
        if growth.target is not None and checkpoint is not None and growth.ready(checkpoint) and \
                ranks.all_pushed_after(checkpoint["time"]):
            return Resize(growth.target, growth.why)
        return None

    def _drain_check(self, growth: sizing.GrowthWatch, checkpoint: dict[str, Any] | None, ranks: Ranks) -> None:
        """About once a second: ranks on a draining node ask for the checkpoint to shrink at."""
        if time.monotonic() < self._next_drain_look:
            return
        self._next_drain_look = time.monotonic() + DRAIN_LOOK_S
        leaving = self._leaving()
        workers = ranks.snapshot()
        going = [w for w in workers if w.get("node_id") in leaving]
        if not going:
            return
        room = self._cluster.room(self.options, len(workers) - len(going), leaving)
        target = max(self.options.min_workers, min(self.options.max_workers, room))
        if growth.target is not None and growth.target <= target:
            return  # already asked for a checkpoint to resize at a size that leaves the node
        nodes = ", ".join(sorted({w["node"] for w in going}))
        growth.request(target, checkpoint, f"{growth.size} → {target} ranks: node {nodes} draining")
        self._say("resize", f"node {nodes} draining: ranks {', '.join(str(w['rank']) for w in going)} "
                            f"leave at the next checkpoint ({growth.size} → {target} ranks)")

    def _room_to_grow(self, held: int) -> int:
        """The room a look for growth counts: none beyond ``held`` while the cluster has no more room than when a
        size it could not place was asked for (a placement strategy the room does not fit, say ``STRICT_SPREAD``
        over fewer nodes than ranks, would otherwise grow, wait and start smaller again at every checkpoint)."""
        room = self._cluster.room(self.options, held, self._leaving())
        if self._unplaced is not None and room >= self._unplaced[0] and room <= self._unplaced[1]:
            return held
        return room

    def _leaving(self) -> set[str]:
        """The nodes this attempt's ranks must leave: drained with ``run.drain()``, or draining as Ray says.
        Where Ray's node state cannot be read, only the former: the run keeps its size, and says so once."""
        draining = self._cluster.draining()
        if draining.unreadable and not self._said_unreadable:
            self._said_unreadable = True
            self._say("resize", f"cannot read which nodes Ray is draining ({draining.unreadable}); the run "
                                f"keeps its size: ranks on a node that goes are lost with it (and the run "
                                f"shrinks then), and run.drain(node) still moves them first")
        return self._drained | draining.nodes

    def _ask_autoscaler(self, size: int) -> None:
        """Below ``max``: ask an autoscaling cluster for room for ``max`` ranks; at it, withdraw the request."""
        try:
            asked = self._cluster.ask(self.options, size)
            if not asked:
                self._cluster.withdraw(self._asked)
            self._asked = asked
        except Exception as exc:  # noqa: BLE001 - a hint to the autoscaler; the run goes on without it
            self._say("resize", f"could not ask Ray's autoscaler for {self.options.max_workers} ranks: {exc}")
