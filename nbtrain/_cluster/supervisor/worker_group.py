"""One attempt's ranks: placed together, started, watched to the end, and torn down.

:meth:`WorkerGroup.start` is a factory, given one
:class:`~nbtrain._cluster.supervisor.attempt.AttemptStart`: it reserves a placement
group, starts one :class:`~nbtrain._cluster.rank.actor.worker.TrainWorker`
actor per rank, asks each where it landed, and builds each rank's
:class:`WorkerPayload`. If anything
fails or the user stops the run on the way, it removes what it had made before
raising, so a failed start leaves no actor and no reserved CPU behind. A rank
process lost before it answers (dead while importing torch, say) is started
again as a fresh process, ``START_RETRIES`` times, each said in an event; then
the attempt fails with that process's own last log lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from nbtrain._cluster.commands import Command
from nbtrain._cluster.elastic.sizing import scaling
from nbtrain._cluster.names import NAMESPACE, group_name, relay_name, worker_name
from nbtrain._cluster.rank.actor.worker import TrainWorker
from nbtrain._cluster.rank.payload import (
    CheckpointSettings,
    CodeToRun,
    ProcessGroupJoin,
    RankPlace,
    ReportTo,
    TrainingAids,
    WorkerPayload,
)
from nbtrain._cluster.relay.push_relay import PushRelay, wants_relays
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.supervisor import failure_policy, rank_logs
from nbtrain._cluster.supervisor.attempt import AttemptStart, NotPlaced
from nbtrain._cluster.supervisor.failure_policy import Failed, Failure, Outcome, Succeeded
from nbtrain._cluster.supervisor.rank_layout import layout_ranks
from nbtrain._cluster.supervisor.worker_table import WorkerTable
from nbtrain._cluster.warm.warm_pool import shape_of
from nbtrain._cluster.working_folder import RankFolder
from nbtrain._options import ELASTIC_PLACEMENT_GRACE_S
from nbtrain._packing.runtime_env import for_ranks
from nbtrain._states import WorkerState

WORKER_START_TIMEOUT_S = 180.0
START_RETRIES = 2        # times a rank process lost while starting is started again before the attempt fails
FAILURE_GATHER_S = 1.0   # after a first failure, how long to wait for the other ranks' (to tell cause from consequence)
WATCH_TICK_S = 0.2
GIVE_BACK_TIMEOUT_S = 10.0


class StopRequested(Exception):
    """The user stopped the run while its workers were starting."""


class StartFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.summary)
        self.failure = failure


class WorkerGroup:
    def __init__(self, spec: RunSpec, attempt: int, world_size: int, run_dir: Path,
                 say: Callable[[str], None]) -> None:
        self.spec = spec
        self.attempt = attempt
        self.world_size = world_size       # this attempt's: fixed, or an elastic run's size for now
        self.run_dir = run_dir             # the run's directory (see working_folder)
        self._say = say                    # an event on the run's feed
        self.actors: list[Any] = []
        self._replaced: set[int] = set()   # ranks whose leased warm worker was lost while starting: ours now
        self.relays: dict[str, Any] = {}  # node id -> its push relay
        self._pool: Any = None             # the warm pool the actors were leased from, if any
        self.warm_ranks: list[int] = []    # the ranks whose leased workers were warm (see warm_among)
        self._leased_gpus: list[list[str]] = []  # by rank: the GPU ids of its bundle, for leased workers
        self._reusable: set[int] = set()   # ranks whose run() returned and whose process another run may take
        self._group: Any = None
        self._refs: list[Any] = []
        self.pushes: dict[int, int] = {}  # rank -> pushes it sent in all, from its outcome
        self.unsent: dict[int, dict[str, float]] = {}  # rank -> what its last flush could not send

    @classmethod
    def start(cls, start: AttemptStart) -> WorkerGroup:
        """Place, start and launch ``start.world_size`` ranks; raises :class:`StartFailed` or :class:`StopRequested`
        after removing whatever it had started. ``start.say`` tells the run's events (a rank started again)."""
        group = cls(start.spec, start.attempt, start.world_size, start.run_dir, start.say)
        stop_requested, table = start.stop_requested, start.table
        try:
            group._place(stop_requested)
            start.on_placed()
            places = group._start_actors(stop_requested)
            start.on_assigned(len(set(group.warm_ranks) - group._replaced))
            group._start_relays(places, start.supervisor)
            payloads = group._payloads(places, start.supervisor, start.datasets, start.commands)
            table.add_group(places, [p.place.device_name for p in payloads], start.attempt)
            group._refs = [actor.run.remote(payload) for actor, payload in zip(group.actors, payloads)]
        except BaseException:
            group.shutdown(table)
            raise
        return group

    def _place(self, stop_requested: Callable[[], bool]) -> None:
        options = self.spec.options
        if self.spec.placement_group is not None:  # reserved by the caller (a sweep's trial); ready already
            self._group = self.spec.placement_group
            return
        bundles = [{"CPU": float(options.cpus_per_worker),
                    **({"GPU": float(options.gpus_per_worker)} if options.gpus_per_worker else {})}
                   for _ in range(self.world_size)]
        # Detached: the notebook's Ray Client job ending must not take the workers' resources with it.
        self._group = placement_group(bundles, strategy=options.placement_strategy,
                                      name=group_name(self.spec.name, self.attempt), lifetime="detached")
        if options.elastic and self.world_size > options.min_workers:
            grace = min(ELASTIC_PLACEMENT_GRACE_S, options.placement_timeout_s)
            if not self._placed_within(grace, stop_requested):
                raise NotPlaced(self.world_size, grace)  # start() removes the group
            return
        self._wait(self._group.ready(), options.placement_timeout_s, stop_requested, lambda: Failure(
            None, "resources",
            f"the cluster could not place {self.world_size} workers with {options.cpus_per_worker:g} CPU"
            f" and {options.gpus_per_worker:g} GPU each within {options.placement_timeout_s:.0f} s: "
            f"{_resource_picture()}. Stop other runs, ask for fewer workers, or add nodes.", retriable=False))

    def _placed_within(self, timeout: float, stop_requested: Callable[[], bool]) -> bool:
        ready = self._group.ready()
        deadline = time.monotonic() + timeout
        while not ray.wait([ready], timeout=0.25)[0]:
            if stop_requested():
                raise StopRequested()
            if time.monotonic() > deadline:
                return False
        return True

    def _start_actors(self, stop_requested: Callable[[], bool]) -> list[dict[str, Any]]:
        if not (self.spec.warm_pool and self._lease_warm(stop_requested)):
            self.actors = [self._new_actor(rank) for rank in range(self.world_size)]
        places = self._places(stop_requested)
        if self._pool is not None:
            for rank, gpu_ids in enumerate(self._leased_gpus):
                places[rank]["gpu_ids"] = gpu_ids  # a leased worker reserves no GPU: its bundle's
                self._pool.note_pid.remote(self.actors[rank], places[rank]["pid"])
        return places

    def _new_actor(self, rank: int) -> Any:
        """A fresh process for ``rank``, in its bundle."""
        options = self.spec.options
        return ray.remote(TrainWorker).options(
            num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=rank),
            name=worker_name(self.spec.name, self.attempt, rank), namespace=NAMESPACE,
            # made by the supervisor, they would inherit its runtime env (see supervisor_options)
            runtime_env=for_ranks(options.runtime_env, options.env),
        ).remote()

    def _places(self, stop_requested: Callable[[], bool]) -> list[dict[str, Any]]:
        """Where each rank landed (its ``where()``); a rank process lost before it answers is replaced by a fresh
        one, ``START_RETRIES`` times, before the attempt fails with its last log lines."""
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        asked = {rank: actor.where.remote() for rank, actor in enumerate(self.actors)}
        places: dict[int, dict[str, Any]] = {}
        lost: dict[int, int] = {}
        while asked:
            if stop_requested():
                raise StopRequested()
            if time.monotonic() > deadline:
                raise StartFailed(Failure(None, "startup",
                                          f"the workers did not start within {WORKER_START_TIMEOUT_S:.0f} s"))
            ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=0.25)
            for rank in [rank for rank, ref in asked.items() if ref in ready]:
                try:
                    places[rank] = ray.get(asked.pop(rank))
                except ray.exceptions.RayActorError as exc:
                    lost[rank] = lost.get(rank, 0) + 1
                    self._lost_while_starting(rank, lost[rank], exc)
                    asked[rank] = self.actors[rank].where.remote()
        return [places[rank] for rank in range(self.world_size)]

    def _lost_while_starting(self, rank: int, times: int, exc: ray.exceptions.RayActorError) -> None:
        """Start ``rank`` again as a fresh process, said in an event; past ``START_RETRIES``, fail the attempt."""
        pid = rank_logs.pid_of(exc)
        cause = failure_policy.death_cause(exc)
        if times > START_RETRIES:
            lines = rank_logs.last_lines(self._group, rank, pid)
            raise StartFailed(Failure(
                rank, "startup",
                f"Rank {rank}'s worker process was lost while starting, {times} times (the last, pid {pid}: {cause}); "
                f"its last log lines are below. A process that dies before the training function starts usually "
                f"cannot load its packages on that node: check them there (`python -c 'import torch'`).",
                traceback=lines))
        self._say(f"Rank {rank}'s worker process (pid {pid}) was lost while starting ({cause}); starting it again "
                  f"as a fresh process ({times}/{START_RETRIES}).")
        try:
            ray.kill(self.actors[rank], no_restart=True)
        except Exception:  # noqa: BLE001 - dead already
            pass
        if self._pool is not None:
            self._replaced.add(rank)  # the pool's worker is gone: the new one is this group's to end
        self.actors[rank] = self._new_actor(rank)

    def _lease_warm(self, stop_requested: Callable[[], bool]) -> bool:
        """Lease one worker per bundle from the notebook session's warm pool (see warm_pool);
        False when there is no pool any more (the session ended): new workers then."""
        options = self.spec.options
        try:
            pool = ray.get_actor(self.spec.warm_pool, namespace=NAMESPACE)
            nodes = _bundle_nodes(self._group, self.world_size)
            self._leased_gpus = self._bundle_gpus(stop_requested)
            layout = layout_ranks([{"node_id": node, "gpu_ids": ids} for node, ids in zip(nodes, self._leased_gpus)],
                                  options.gpus_per_worker)
            views = [(entry["cuda_visible_devices"], entry["device_name"]) if options.gpus_per_worker else None
                     for entry in layout]
            bundles = list(zip(nodes, views))
            leased = pool.lease.remote(self.spec.name, shape_of(options), bundles, options.warm_idle_s)
            lent, self.warm_ranks = self._wait(leased, WORKER_START_TIMEOUT_S, stop_requested,
                                               lambda: Failure(None, "startup", "the warm pool did not answer"))
        except (ValueError, StartFailed, ray.exceptions.RayError):
            return False
        self._pool = pool
        self.actors = lent
        return True

    def _bundle_gpus(self, stop_requested: Callable[[], bool]) -> list[list[str]]:
        """The GPU ids each bundle of the placement group reserved (a zero-CPU task in each asks Ray)."""
        options = self.spec.options
        if not options.gpus_per_worker:
            return [[] for _ in range(self.world_size)]
        probe = ray.remote(_assigned_gpus)
        return list(self._wait([probe.options(
            num_cpus=0, num_gpus=options.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=rank),
        ).remote() for rank in range(self.world_size)], WORKER_START_TIMEOUT_S, stop_requested,
            lambda: Failure(None, "startup", "the placement group's GPUs could not be read")))

    def _start_relays(self, places: list[dict[str, Any]], supervisor: Any) -> None:
        """A push relay on each node that wants one (see :mod:`~nbtrain._cluster.relay.push_relay`); no CPU reserved."""
        by_node: dict[str, int] = {}
        for place in places:
            by_node[place["node_id"]] = by_node.get(place["node_id"], 0) + 1
        for node_id, count in by_node.items():
            if wants_relays(self.spec.options.feed_relay, len(places), count):
                self.relays[node_id] = ray.remote(PushRelay).options(
                    num_cpus=0, max_restarts=0, name=relay_name(self.spec.name, self.attempt, node_id),
                    namespace=NAMESPACE, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                ).remote(supervisor, count, self.attempt)

    def _payloads(self, places: list[dict[str, Any]], supervisor: Any,
                  datasets: dict[str, Any] | None, commands: list[Command]) -> list[WorkerPayload]:
        options = self.spec.options
        layout = layout_ranks(places, options.gpus_per_worker)
        batch_scale, lr_scale = scaling(options, self.world_size)
        shards = {name: dataset.streaming_split(self.world_size, equal=True)
                  for name, dataset in (datasets or {}).items()}
        # a runtime_env working_dir is where Ray puts the ranks, and stays their folder
        folder = None if "working_dir" in (options.runtime_env or {}) else \
            RankFolder(self.spec.launch_folder, str(self.run_dir))
        process_group = ProcessGroupJoin(backend=options.resolved_backend, master_addr=places[0]["node_ip"],
                                         master_port=places[0]["port"],
                                         collective_timeout_s=options.collective_timeout_s)
        checkpoints = CheckpointSettings(storage=options.storage, weights_only=options.checkpoint_weights_only)
        training = TrainingAids(precision=options.precision, batch_scale=batch_scale, lr_scale=lr_scale,
                                gns=options.gns or options.adaptive_batch is not None,
                                adaptive_batch=options.adaptive_batch, step_timing=options.step_timing)
        return [WorkerPayload(
            run_name=self.spec.name, attempt=self.attempt,
            place=RankPlace(rank=rank, world_size=self.world_size, **layout[rank]),
            process_group=process_group,
            code=CodeToRun(fn_bytes=self.spec.fn_bytes, fn_takes_config=self.spec.fn_takes_config,
                           config=dict(options.config or {}), cpus_per_worker=options.cpus_per_worker,
                           datasets={name: split[rank] for name, split in shards.items()}, folder=folder),
            report_to=ReportTo(supervisor=supervisor, relay=self.relays.get(places[rank]["node_id"]),
                               flush_interval_s=options.flush_interval_s),
            checkpoints=checkpoints, training=training, commands=commands,
            debug_capture_mb=options.debug_capture_mb,
        ) for rank in range(len(places))]

    def _wait(self, refs: Any, timeout: float, stop_requested: Callable[[], bool],
              on_timeout: Callable[[], Failure]) -> Any:
        single = not isinstance(refs, list)
        pending = [refs] if single else list(refs)
        deadline = time.monotonic() + timeout
        while True:
            if stop_requested():
                raise StopRequested()
            _ready, not_ready = ray.wait(pending, num_returns=len(pending), timeout=0.25)
            if not not_ready:
                try:
                    values = ray.get(pending)
                except ray.exceptions.RayActorError as exc:
                    raise StartFailed(Failure(None, "startup", f"a worker died while starting: {exc}")) from exc
                return values[0] if single else values
            if time.monotonic() > deadline:
                raise StartFailed(on_timeout())

    def watch(self, table: WorkerTable, interrupt: Callable[[], Outcome | None]) -> Outcome:
        """Wait for every rank's outcome; ``interrupt`` (checked every tick) may end the attempt early."""
        pending = list(self._refs)
        results: dict[int, bytes] = {}
        failures: list[Failure] = []
        first_failure_at: float | None = None
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=WATCH_TICK_S)
            for ref in ready:
                rank = self._refs.index(ref)
                failure = self._outcome(rank, ref, table, results)
                if failure is not None:
                    failures.append(failure)
                    first_failure_at = first_failure_at or time.monotonic()
            if first_failure_at is not None and (not pending or time.monotonic() - first_failure_at > FAILURE_GATHER_S):
                return Failed(failure_policy.order(failures))
            early = interrupt()
            if early is not None:
                return early
        return Succeeded([results[rank] for rank in range(len(self._refs))])

    def _outcome(self, rank: int, ref: Any, table: WorkerTable, results: dict[int, bytes]) -> Failure | None:
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            worker = table.mark(rank, WorkerState.DEAD)
            return failure_policy.died(rank, worker.get("pid"), worker.get("node"), worker.get("node_id"), exc)
        self.pushes[rank] = outcome["pushes"]
        self.unsent[rank] = outcome["unsent"]
        if outcome.get("reusable", True):
            self._reusable.add(rank)
        if outcome["ok"]:
            table.mark(rank, WorkerState.STOPPED if outcome.get("stopped") else WorkerState.FINISHED)
            results[rank] = outcome["result"]
            return None
        table.mark(rank, WorkerState.FAILED)
        return failure_policy.raised(rank, outcome)

    def shutdown(self, table: WorkerTable) -> None:
        """Kill every actor (leased workers whose run returned go back to the warm pool instead: see
        :func:`giving_back`) and free the placement group; ranks still going show as stopped."""
        ended = list(self.relays.values())
        if self._pool is not None:
            back = giving_back(len(self.actors), self._replaced, self._reusable)
            try:  # waited for: the supervisor may exit next, and an unsent call would leave them lent
                ray.get(self._pool.give_back.remote(self.spec.name, [self.actors[rank] for rank in back]),
                        timeout=GIVE_BACK_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the pool is gone (its workers with it) or exiting
                pass
            ended += [actor for rank, actor in enumerate(self.actors) if rank not in back]
        else:
            ended += self.actors
        for actor in ended:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        self.actors = []
        self.relays = {}
        if self._group is not None and self.spec.placement_group is None:
            try:
                remove_placement_group(self._group)
            except Exception:  # noqa: BLE001 - already removed is fine
                pass
            self._group = None
        table.stop_live()


def giving_back(world_size: int, replaced: set[int], reusable: set[int]) -> list[int]:
    """The ranks whose leased warm workers go back to the pool as an attempt ends, whatever its outcome: those
    whose ``run()`` returned with a process another run may take (a rank that failed in its own code, with
    CUDA never touched, is as fresh as one that succeeded: the next run, or the next attempt of this one,
    takes it warm). A rank still running (stopped, or stuck in a collective its peer left) is killed, and
    so is a worker started in place of a leased one lost while starting (it was never the pool's)."""
    return [rank for rank in range(world_size) if rank in reusable and rank not in replaced]


def remove_leftover_group(spec: RunSpec, attempt: int) -> None:
    """Free the placement group a previous supervisor process left, and end the workers a warm pool had
    lent it (workers it started itself died with it)."""
    from ray.util import get_placement_group

    run_name = spec.name
    if spec.warm_pool:
        try:
            pool = ray.get_actor(spec.warm_pool, namespace=NAMESPACE)
            ray.get(pool.give_back.remote(run_name, []), timeout=GIVE_BACK_TIMEOUT_S)
        except (ValueError, ray.exceptions.RayError):
            pass  # no pool: nothing was lent, or it ended with its workers
    if spec.placement_group is not None:
        return  # the group is its owner's (a sweep's trial); the workers a previous supervisor started died with it
    try:
        remove_placement_group(get_placement_group(group_name(run_name, attempt)))
    except Exception:  # noqa: BLE001 - nothing left over
        pass


def _bundle_nodes(group: Any, count: int) -> list[str]:
    """The node id each bundle of a ready placement group is on."""
    from ray.util import placement_group_table

    by_bundle = placement_group_table(group)["bundles_to_node_id"]
    return [by_bundle[index] for index in range(count)]


def _assigned_gpus() -> list[str]:
    return [str(gpu) for gpu in ray.get_gpu_ids()]


def _resource_picture() -> str:
    total = ray.cluster_resources()
    free = ray.available_resources()
    parts = [f"{key} {free.get(key, 0):g} free of {total[key]:g}" for key in ("CPU", "GPU") if key in total]
    return ", ".join(parts) or "no CPU/GPU resources"
