"""Warm workers: a notebook session's idle rank processes, kept ready for its next run of the same shape.

A rank's process costs seconds to start (a Python process, ``import torch``, the
allocator, CUDA on a GPU). People change one line and run the cell again, so the
workers of a run that ended well wait, idle, for the next run from the same
notebook session whose workers have the same shape (CPUs and GPUs per worker,
``env`` and ``runtime_env``), on the same nodes, and — on GPUs — the same GPU
ids. A relaunch takes as many as it has ranks instead of starting new ones: a
run with fewer ranks leaves the others idle, one with more starts only the
missing ones.

Who owns what, and why:

* Each notebook session (Ray Client connection) has one :class:`WarmPool`, a
  detached actor named :func:`~nbtrain._cluster.names.pool_name`, tied to the
  session's :class:`~nbtrain._cluster.warm.session_anchor.SessionAnchor`, an actor the
  notebook owns: it dies when the session ends (kernel restart, ``disconnect()``,
  lost connection).
* The pool starts the workers, so they are its actors and die with it. Workers
  reserve no CPU or GPU (``num_cpus=0``, pinned to a node): each run's placement
  group reserves its ranks' resources, so idle workers never make another run,
  a sweep's trials or an elastic run wait.
* A running run's workers must outlive the notebook (runs survive kernel
  restarts); so the pool is detached, and when its anchor dies it ends its idle
  workers at once and exits once the last run it lent workers to has given
  them back.
* A worker's GPUs are fixed by its first run that had any: CUDA reads
  ``CUDA_VISIBLE_DEVICES`` once, when the process first touches it, and ignores
  later changes. So a worker remembers the CUDA view of that run (the visible
  GPU ids and its device index among them) and is lent again only to a rank
  whose bundle gives the same view (on the same node); a relaunch whose bundles
  got other GPUs gets new workers, never another run's GPU.
* Idle workers end after the ``warm_idle_s`` of the run that used them last,
  on ``release()`` (``nbtrain.release_warm()``), or when a run whose workers have
  another shape leases from the pool. Only workers whose ``run()`` returned come back: a
  stopped run's (every rank ends its function at the stop's step), a failed attempt's (a re-run after a
  fix, or the next attempt, takes them warm) unless the rank used CUDA; a rank still running as its
  attempt ends (one that did not reach the stop's step in time, or stuck in a collective) is killed.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nbtrain._cluster.rank.actor.worker import TrainWorker
from nbtrain._cluster.warm.spare_process import prestart_for_supervisors
from nbtrain._packing.runtime_env import environment_key, for_ranks
from nbtrain._ray_compat import actor_key

if TYPE_CHECKING:
    from nbtrain._options import RunOptions

WATCH_INTERVAL_S = 1.0
ALIVE_CHECK_S = 30.0  # a worker still starting (prestarted) answers once torch is imported; a dead one at once

class Shape(NamedTuple):
    """What a warm worker must match to be reused by a run's rank (besides its node and GPU ids)."""

    cpus: float
    gpus: float
    env: tuple[tuple[str, str], ...]
    runtime_env: str  # environment_key() of the run's runtime_env


def shape_of(options: RunOptions) -> Shape:
    """The shape of the workers of a run with these options."""
    return Shape(float(options.cpus_per_worker), float(options.gpus_per_worker),
                 tuple(sorted((options.env or {}).items())), environment_key(options.runtime_env))


def describe_shape(shape: Shape) -> str:
    text = f"{shape.cpus:g} CPU, {shape.gpus:g} GPU"
    text += f", env {', '.join(key for key, _ in shape.env)}" if shape.env else ""
    return text + (f", runtime_env {shape.runtime_env}" if shape.runtime_env != environment_key(None) else "")


CudaView = tuple[str, str]  # what CUDA shows a rank: CUDA_VISIBLE_DEVICES, and its device ("cuda:1")
Bundle = tuple[str, CudaView | None]  # where a rank runs: its node, and its CUDA view (None: no GPU)


@dataclasses.dataclass
class _Worker:
    handle: Any
    shape: Shape
    node_id: str
    pid: int
    cuda_view: CudaView | None = None     # fixed by its first run with GPUs
    leased_by: str | None = None          # the run using it; None while idle
    idle_since: float = 0.0
    idle_s: float = 0.0
    for_launch: bool = False              # started by a launch's own prestart: not warm for that launch


def stale_for(workers: list[_Worker], run_name: str, shape: Shape) -> list[_Worker]:
    """The workers to end as ``run_name`` leases workers of ``shape``: those it leased before and did not give
    back (its supervisor restarted), and idle ones of another shape (the session moved on)."""
    return [w for w in workers if w.leased_by == run_name or (w.leased_by is None and w.shape != shape)]


def choose(bundles: list[Bundle], idle: list[_Worker]) -> list[_Worker | None]:
    """For each rank's bundle, an idle worker on its node whose CUDA view is the bundle's or not fixed yet (it
    never had a GPU), each worker at most once; None where none fits (a new worker starts for that rank)."""
    free = list(idle)
    chosen: list[_Worker | None] = []
    for node_id, view in bundles:
        match = next((w for w in free if w.node_id == node_id and w.cuda_view in (None, view)), None)
        if match is not None:
            free.remove(match)
        chosen.append(match)
    return chosen


def warm_among(chosen: list[_Worker | None]) -> list[int]:
    """The ranks of a lease whose workers were warm: started before the launch asked (by ``connect()``'s warming,
    idle after an earlier run, or started for an earlier launch that did not take them), not by that launch's
    own prestart a moment before (those still start cold)."""
    return [rank for rank, worker in enumerate(chosen) if worker is not None and not worker.for_launch]


def lend(worker: _Worker, run_name: str, view: CudaView | None) -> None:
    """``worker`` is ``run_name``'s now; its first CUDA view stays its view for good (CUDA reads it once)."""
    worker.leased_by = run_name
    worker.cuda_view = worker.cuda_view or view


class WarmPool:
    """Runs as a detached, threaded Ray actor on the head node: one per notebook session."""

    def __init__(self, anchor: Any) -> None:
        self._anchor = anchor
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._prestarting = threading.Lock()
        self._spare_asked: set[str] = set()  # runs that had Ray start a process for the next supervisor
        self._closing = False  # the session ended: no more idling, exit once nothing is lent
        threading.Thread(target=self._watch, name="nbtrain-warm-watch", daemon=True).start()

    # ------------------------------------------------------------------ called by a run's worker group
    def lease(self, run_name: str, shape: Shape, bundles: list[Bundle], idle_s: float) -> tuple[list[Any], list[int]]:
        """One worker per rank (``bundles[rank]`` is the node and CUDA view of its bundle): an idle one of this
        shape on that node with that CUDA view (or one that never had a GPU), else a new one. Returns their
        handles, by rank, and the ranks whose workers were warm (:func:`warm_among`; the others started for
        this launch). Idle ones of this shape left over (the run has fewer ranks than the last) stay idle for
        the next run.

        Idle workers of another shape are ended (the session moved on); workers this run leased before
        and did not give back (its supervisor restarted) are ended too.
        """
        with self._lock:
            if self._closing:
                raise RuntimeError("this notebook session has ended; its warm workers are gone")
            self._end(stale_for(self._workers, run_name, shape))
            idle = [w for w in self._workers if w.leased_by is None]
        alive = self._alive(idle)
        with self._lock:
            chosen = choose(bundles, [w for w in alive if w.leased_by is None and w in self._workers])
            for worker, (_, view) in zip(chosen, bundles):
                if worker is not None:
                    lend(worker, run_name, view)
            self._end([w for w in idle if w not in alive])
        lent = []
        warm_ranks = warm_among(chosen)
        for rank, worker in enumerate(chosen):
            if worker is None:
                worker = self._start(shape, bundles[rank][0], run_name, idle_s)
                worker.cuda_view = bundles[rank][1]
            worker.idle_s = idle_s
            lent.append(worker.handle)
        return lent, warm_ranks

    def prestart(self, shape: Shape, workers: int, idle_s: float, background: bool = False) -> None:
        """Have ``workers`` idle workers of ``shape`` before the run asks, so the missing ones' process start
        and ``import torch`` overlap the supervisor's start and the placement. Only on a one-node cluster
        (the embedded one, a laptop), where the node a bundle lands on is known in advance. ``background``:
        no launch waits for them yet (``connect()`` warms the first run's): they import torch at a
        bookkeeping priority, and a process for that run's supervisor is asked for first (from here, on the
        cluster: a notebook over Ray Client has no token for the raylet's own port)."""
        if background:
            prestart_for_supervisors(idle_s)
        with self._prestarting:  # two at once (connect()'s, then a launch's) would each count the same idle ones
            alive = [node for node in ray.nodes() if node["Alive"]]
            if len(alive) != 1:
                return
            with self._lock:
                if self._closing:
                    return
                self._end([w for w in self._workers if w.leased_by is None and w.shape != shape])
                idle = [w for w in self._workers if w.leased_by is None]
                if not background:  # started for an earlier launch that did not take them: warm for this one
                    for worker in idle:
                        worker.for_launch = False
                have = len(idle)
            for _ in range(workers - have):
                self._start(shape, alive[0]["NodeID"], None, idle_s, background, for_launch=not background)

    def give_back(self, run_name: str, handles: list[Any]) -> None:
        """The run ended: ``handles`` (workers whose ``run()`` returned) idle; its others are ended; and a
        process for the next launch's supervisor, if the run did not have one started yet."""
        keep = {actor_key(handle) for handle in handles}
        with self._lock:
            mine = [w for w in self._workers if w.leased_by == run_name]
            keep_alive_s = max((w.idle_s for w in mine), default=0.0)
            now = time.monotonic()
            for worker in mine:
                if actor_key(worker.handle) in keep and not self._closing:
                    worker.leased_by = None
                    worker.idle_since = now
                    worker.for_launch = False  # warm for the next launch
                    worker.handle.tidy.remote()  # now, while idle, not as the next run starts
            self._end([w for w in mine if w.leased_by is not None])
        if keep_alive_s:  # unless its first step asked already: the supervisor is exiting, the next launch's needs one
            self.spare_for_next_supervisor(run_name, keep_alive_s)
        with self._lock:
            self._spare_asked.discard(run_name)
        self._exit_if_done()

    def spare_for_next_supervisor(self, run_name: str, keep_alive_s: float) -> None:
        """Have Ray start a process for the next launch's supervisor (see spare_process), once per run: its
        supervisor asks once its ranks are past their first step (off the launch's CPU), else its workers'
        return does (a run that ended sooner)."""
        with self._lock:
            if self._closing or run_name in self._spare_asked:
                return
            self._spare_asked.add(run_name)
        prestart_for_supervisors(keep_alive_s)

    # ------------------------------------------------------------------ called by the notebook and the sidebar
    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            return [{"shape": describe_shape(w.shape), "node_id": w.node_id, "pid": w.pid,
                     "run": w.leased_by, "state": "busy" if w.leased_by else "idle",
                     "expires_in_s": None if w.leased_by else max(w.idle_s - (now - w.idle_since), 0.0)}
                    for w in self._workers]

    def release(self) -> int:
        """End every idle worker now; returns how many."""
        with self._lock:
            idle = [w for w in self._workers if w.leased_by is None]
            self._end(idle)
        return len(idle)

    # ------------------------------------------------------------------ inside
    def _start(self, shape: Shape, node_id: str, run_name: str | None, idle_s: float,
               background: bool = False, for_launch: bool = False) -> _Worker:
        handle = ray.remote(TrainWorker).options(
            num_cpus=0, num_gpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            runtime_env=for_ranks(json.loads(shape.runtime_env), dict(shape.env)),
        ).remote(background)
        worker = _Worker(handle, shape, node_id, pid=0, leased_by=run_name, idle_since=time.monotonic(),
                         idle_s=idle_s, for_launch=for_launch)
        with self._lock:
            self._workers.append(worker)
        return worker

    def note_pid(self, handle: Any, pid: int) -> None:
        """The worker group tells the pid it saw in ``where()`` (for ``describe``)."""
        with self._lock:
            for worker in self._workers:
                if actor_key(worker.handle) == actor_key(handle):
                    worker.pid = pid

    def _alive(self, workers: list[_Worker]) -> list[_Worker]:
        """The workers that answer (one killed while idle is not lent)."""
        if not workers:
            return []
        refs = [w.handle.ping.remote() for w in workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=ALIVE_CHECK_S)
        alive = []
        for worker, ref in zip(workers, refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except Exception:  # noqa: BLE001 - dead: dropped
                    continue
                alive.append(worker)
        return alive

    def _end(self, workers: list[_Worker]) -> None:
        """Kill ``workers`` and forget them (the caller holds the lock)."""
        for worker in workers:
            try:
                ray.kill(worker.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
            if worker in self._workers:
                self._workers.remove(worker)

    def _watch(self) -> None:
        """Ends idle workers past their time, and everything idle once the notebook session is gone (the call
        to its anchor that never returns has failed)."""
        session_gone = self._anchor.until_gone.remote()
        while True:
            ended, _ = ray.wait([session_gone], timeout=WATCH_INTERVAL_S)  # the period of the idle check
            now = time.monotonic()
            with self._lock:
                self._end([w for w in self._workers if w.leased_by is None and now - w.idle_since > w.idle_s])
            if ended and not self._closing:
                with self._lock:
                    self._closing = True
                    self._end([w for w in self._workers if w.leased_by is None])
            self._exit_if_done()

    def _exit_if_done(self) -> None:
        with self._lock:
            done = self._closing and not self._workers
        if done:  # from the watch thread too, so not exit_actor(): the pool's own handle
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
