"""RunSupervisor: the detached actor that owns one run, from placement to result.

The notebook only submits a :class:`RunSpec` and reads; everything else lives
here, so closing the browser, restarting the kernel or losing the Ray Client
connection leaves the run going. One supervisor per run, named
``nbtrain-run:<name>`` in the ``nbtrain`` namespace, pinned to the head node,
with ``max_restarts=-1``: if its process dies Ray restarts it and it reloads
its history from :class:`RunStorage` and restarts the workers from the latest
checkpoint.

It is a *threaded* actor: ``push`` (from workers) and ``poll`` (from notebooks)
run concurrently with the control thread that builds, watches and tears down
worker groups. One lock guards the shared history; no method blocks on workers
while holding it.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
from typing import Any

import cloudpickle
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nbtrain._cluster.priority import lower_own_priority
from nbtrain._cluster.storage import RunStorage, default_storage_root
from nbtrain._cluster.spec import RunSpec
from nbtrain._states import RunState, WorkerState, check_transition
from nbtrain._cluster.worker import TrainWorker

NAMESPACE = "nbtrain"
ACTOR_PREFIX = "nbtrain-run:"
WORKER_START_TIMEOUT_S = 180.0
FAILURE_GATHER_S = 1.0
# Ranks flush on the same wall-clock ticks (see _session.until_next_tick); a long poll
# woken by the first rank's push waits this long at most for the others of that tick.
TICK_GATHER_S = 0.05
# A rank whose collective broke because *another* rank failed says one of these;
# such errors are consequences, listed after the cause.
_SECONDARY_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                      "NCCL communicator was aborted", "ProcessGroupGloo", "recvBytes", "sendBytes")


def actor_name(run_name: str) -> str:
    return ACTOR_PREFIX + run_name


class _StopRequested(Exception):
    pass


class _Failure:
    """Why one attempt ended badly, in words a user can act on."""

    def __init__(self, rank: int | None, kind: str, summary: str, traceback_text: str = "",
                 retriable: bool = True, secondary: bool = False) -> None:
        self.rank = rank
        self.kind = kind
        self.summary = summary
        self.traceback = traceback_text
        self.retriable = retriable
        self.secondary = secondary

    def as_dict(self, attempt: int) -> dict[str, Any]:
        return {"rank": self.rank, "kind": self.kind, "summary": self.summary,
                "traceback": self.traceback, "attempt": attempt, "secondary": self.secondary}


class RunSupervisor:
    def __init__(self, spec_bytes: bytes, datasets: dict[str, Any] | None = None) -> None:
        lower_own_priority()  # the ranks' cores come first; see _priority
        self.spec: RunSpec = cloudpickle.loads(spec_bytes)
        self.spec.datasets = datasets
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # wakes long-polling notebooks
        self._stop_event = threading.Event()
        self._nan_event = threading.Event()
        self._storage = RunStorage(self.spec.storage or default_storage_root(), self.spec.name)
        self._handle = ray.get_runtime_context().current_actor
        self.rows: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._seen: set[tuple[int, int, int]] = set()
        self._last_push: dict[int, float] = {}  # rank -> monotonic arrival of its latest push
        self.workers: dict[int, dict[str, Any]] = {}
        self.state = RunState.PENDING
        self.attempt = 0
        self.failures: list[dict[str, Any]] = []
        self.error: str | None = None
        self.results: list[bytes] | None = None
        self.checkpoint: dict[str, Any] | None = None
        self.started = time.time()
        self.ended: float | None = None
        self.stop_requested = False
        self._group: tuple[list[Any], Any] | None = None
        self._recover()
        if not self.state.is_terminal:
            self._control_thread = threading.Thread(target=self._control, name="nbtrain-control",
                                                    daemon=True, args=(False,))
            self._control_thread.start()

    # ------------------------------------------------------------------ persistence
    def _recover(self) -> None:
        saved = self._storage.load_state()
        if not saved:
            self._persist_state()
            self._event("state", f"run {self.spec.name} created")
            return
        self.rows = self._storage.load("metrics")
        self.logs = self._storage.load("logs")
        self.events = self._storage.load("events")
        self.attempt = saved["attempt"]
        self.failures = saved["failures"]
        self.error = saved["error"]
        self.checkpoint = saved["checkpoint"]
        self.started = saved["started"]
        self.ended = saved["ended"]
        self.state = RunState(saved["state"])
        self.stop_requested = saved.get("stop_requested", False)
        if not self.state.is_terminal and self.stop_requested:
            # The user's stop must win over Ray bringing the supervisor back mid-stop.
            _remove_leftover_group(self.spec.name, self.attempt)
            self._set_state(RunState.STOPPED, "stopped by the user (the supervisor restarted while stopping)")
        elif not self.state.is_terminal:
            self.state = RunState.RESTARTING
            _remove_leftover_group(self.spec.name, self.attempt)
            self._event("restart", "the run's supervisor process was restarted; its workers died with it. "
                                   "Restarting them from the latest checkpoint (history kept).")

    def _persist_state(self) -> None:
        self._storage.save_state({
            "state": self.state.value, "attempt": self.attempt, "failures": self.failures,
            "error": self.error, "checkpoint": self.checkpoint, "started": self.started,
            "ended": self.ended, "stop_requested": self.stop_requested,
        })

    # ------------------------------------------------------------------ bookkeeping
    def _event(self, kind: str, message: str) -> None:
        record = {"time": time.time(), "kind": kind, "message": message, "attempt": self.attempt}
        with self._lock:
            self.events.append(record)
            self._storage.append("events", [record])
            self._changed.notify_all()

    def _set_state(self, new: RunState, why: str = "") -> None:
        with self._lock:
            if new == self.state:
                return
            check_transition(self.state, new)
            self.state = new
            if new.is_terminal:
                self.ended = time.time()
            self._persist_state()
        self._event("state", f"{new.value}" + (f": {why}" if why else ""))

    # ------------------------------------------------------------------ worker-facing
    def push(self, rank: int, attempt: int, seq: int, rows: list[dict[str, Any]],
             beat: dict[str, Any], logs: list[tuple[str, float, str]]) -> None:
        """Rows, heartbeat and log text from one rank; called fire-and-forget by its flusher."""
        with self._lock:
            key = (attempt, rank, seq)
            if key in self._seen:
                return
            self._seen.add(key)
            if rows:
                self.rows.extend(rows)
                self._storage.append("metrics", rows)
                for row in rows:
                    if _has_nan(row):
                        self._note_nan(row)
            if logs:
                records = [{"rank": rank, "attempt": attempt, "stream": stream, "time": when, "text": text}
                           for stream, when, text in logs]
                self.logs.extend(records)
                self._storage.append("logs", records)
            self._last_push[rank] = time.monotonic()
            if attempt == self.attempt and rank in self.workers:
                worker = self.workers[rank]
                state = beat.pop("state", None)
                worker.update(beat)
                worker["last_heartbeat"] = beat["time"]
                if state == "running" and worker["state"] in (WorkerState.STARTING, WorkerState.STALLED):
                    worker["state"] = WorkerState.RUNNING
            self._changed.notify_all()

    def _note_nan(self, row: dict[str, Any]) -> None:
        keys = ", ".join(_nan_keys(row))
        if not any(e["kind"] == "nan" and e["attempt"] == self.attempt for e in self.events):
            action = "stopping the run (stop_on_nan)" if self.spec.stop_on_nan else "training continues"
            self._event("nan", f"Rank {row['rank']} reported NaN for {keys} at step {row['step']}; {action}.")
        if self.spec.stop_on_nan:
            self._nan_event.set()

    def resume(self, spec_bytes: bytes, datasets: dict[str, Any] | None = None) -> str:
        """Start an ended run again as a new attempt from its latest checkpoint (``launch(resume=True)``).

        Returns ``"resumed"``, or the state that prevented it (a run still going).
        """
        with self._lock:
            if not self.state.is_terminal:
                return self.state.value
            spec: RunSpec = cloudpickle.loads(spec_bytes)
            spec.datasets = datasets
            self.spec = spec
            self.state = RunState.RESTARTING  # the one move out of a terminal state, on the user's request
            self.error = None
            self.ended = None
            self.stop_requested = False
            self._stop_event.clear()
            self._nan_event.clear()
            self._persist_state()
        self._event("restart", f"resumed by the user from {'the latest checkpoint' if self.checkpoint else 'scratch'}")
        self._control_thread = threading.Thread(target=self._control, name="nbtrain-control", daemon=True,
                                                args=(True,))
        self._control_thread.start()
        return "resumed"

    def record_checkpoint(self, meta: dict[str, Any], data: bytes | None, path: str | None) -> None:
        if data is not None:
            path = self._storage.write_checkpoint(meta, data)
        with self._lock:
            self.checkpoint = {**meta, "path": path}
            self._persist_state()
        self._event("checkpoint", f"checkpoint saved at step {meta['step']} (attempt {meta['attempt']})")

    def latest_checkpoint(self) -> tuple[dict[str, Any], bytes | None, str | None] | None:
        with self._lock:
            checkpoint = self.checkpoint
        if checkpoint is None:
            return None
        path = checkpoint["path"]
        if self.spec.storage:
            return checkpoint, None, path
        with open(path, "rb") as handle:
            return checkpoint, handle.read(), None

    # ------------------------------------------------------------------ notebook-facing
    def poll(self, cursor: int = 0, log_cursor: int = 0, event_cursor: int = 0,
             max_rows: int = 50_000, wait_s: float = 0.0) -> dict[str, Any]:
        """Everything new since the caller's cursors. Cursors are list indices into
        append-only histories, so a reconnecting notebook replays exactly what it missed.

        With ``wait_s`` the call is a long poll: it returns as soon as something new
        arrives (or ``wait_s`` passes), so a dashboard gets rows one flush after they
        were reported without calling in a tight loop.
        """
        with self._lock:
            def has_news() -> bool:
                return (cursor < len(self.rows) or log_cursor < len(self.logs)
                        or event_cursor < len(self.events) or self.state.is_terminal)

            if wait_s > 0 and not has_news():
                deadline = time.monotonic() + min(wait_s, 10.0)
                while not has_news() and (left := deadline - time.monotonic()) > 0:
                    self._changed.wait(timeout=left)
                if cursor < len(self.rows):  # woken by a rank's rows, not by a timeout or an event
                    self._gather_tick_locked()
            rows = self.rows[cursor:cursor + max_rows]
            logs = self.logs[log_cursor:log_cursor + max_rows]
            return {
                "rows": rows, "cursor": cursor + len(rows), "has_more": cursor + len(rows) < len(self.rows),
                "logs": logs, "log_cursor": log_cursor + len(logs),
                "events": self.events[event_cursor:], "event_cursor": len(self.events),
                **self._summary_locked(),
            }

    def _gather_tick_locked(self) -> None:
        """Let the other running ranks' pushes of this flush tick arrive before answering."""
        woke = time.monotonic()
        deadline = woke + TICK_GATHER_S
        recent = woke - self.spec.flush_interval_s / 2  # pushed on this tick, not the last one
        running = [rank for rank, worker in self.workers.items()
                   if worker["state"] in (WorkerState.RUNNING, WorkerState.STALLED)]
        while (any(self._last_push.get(rank, 0.0) < recent for rank in running)
               and (left := deadline - time.monotonic()) > 0):
            self._changed.wait(timeout=left)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return self._summary_locked()

    def _summary_locked(self) -> dict[str, Any]:
        now = time.time()
        workers = []
        for rank in sorted(self.workers):
            worker = dict(self.workers[rank])
            worker["state"] = str(worker["state"])
            worker["heartbeat_age_s"] = now - worker["last_heartbeat"] if worker.get("last_heartbeat") else None
            workers.append(worker)
        steps = [w.get("step", 0) for w in workers] or [0]
        return {
            "name": self.spec.name, "state": self.state.value, "attempt": self.attempt,
            "max_failures": self.spec.max_failures, "workers": workers, "error": self.error,
            "failures": list(self.failures), "checkpoint": self.checkpoint, "started": self.started,
            "ended": self.ended, "now": now, "config": self.spec.config, "world_size": self.spec.workers,
            "gpus_per_worker": self.spec.gpus_per_worker, "cpus_per_worker": self.spec.cpus_per_worker,
            "total_steps": self.spec.total_steps, "total_epochs": self.spec.total_epochs,
            "step": min(steps), "rows_total": len(self.rows), "owner": self.spec.owner,
        }

    def result(self) -> list[bytes] | None:
        return self.results

    def stop(self, timeout: float = 20.0) -> str:
        """Stop the run; returns when its workers are gone and its resources freed."""
        with self._lock:
            if not self.state.is_terminal and not self.stop_requested:
                self.stop_requested = True
                self._persist_state()
        self._stop_event.set()
        deadline = time.time() + timeout
        thread = getattr(self, "_control_thread", None)
        if thread is not None:
            thread.join(timeout=max(0.0, deadline - time.time()))
        return self.state.value

    # ------------------------------------------------------------------ control thread
    def _control(self, fresh_budget: bool) -> None:
        try:
            # a user's resume starts the failure budget afresh; a supervisor restart does not
            failed_attempts = 0 if fresh_budget else len({f["attempt"] for f in self.failures})
            while True:
                with self._lock:
                    self.attempt += 1
                    self._persist_state()
                outcome = self._run_attempt()
                if outcome is None:
                    self.results = self._results
                    self._set_state(RunState.SUCCEEDED)
                    return
                if outcome == "stopped":
                    self._set_state(RunState.STOPPED, "stopped by the user")
                    return
                failures: list[_Failure] = outcome
                with self._lock:
                    self.failures.extend(f.as_dict(self.attempt) for f in failures)
                failed_attempts += 1
                retriable = all(f.retriable for f in failures)
                if retriable and failed_attempts <= self.spec.max_failures:
                    why = _failure_headline(failures)
                    self._set_state(RunState.RESTARTING,
                                    f"attempt {self.attempt + 1}/{self.spec.max_failures + 1} after: {why}")
                    time.sleep(min(2.0, 0.5 * failed_attempts))
                    continue
                with self._lock:
                    self.error = _format_error(self.failures, self.spec, self.attempt, failed_attempts)
                self._set_state(RunState.FAILED, _failure_headline(failures))
                return
        except Exception:  # noqa: BLE001 - a bug here must still end the run visibly
            with self._lock:
                self.error = "nbtrain's run supervisor hit an internal error:\n" + traceback.format_exc()
            self._teardown()
            if not self.state.is_terminal:
                self._set_state(RunState.FAILED, "internal error")
        finally:
            with self._lock:
                self._persist_state()

    def _run_attempt(self) -> list[_Failure] | str | None:
        """One worker group from placement to the end; None on success."""
        spec = self.spec
        self._results: list[bytes] | None = None
        with self._lock:
            self.workers = {}
        try:
            if self.state in (RunState.RESTARTING,):
                self._set_state(RunState.PENDING)
            bundles = [{"CPU": float(spec.cpus_per_worker), **({"GPU": float(spec.gpus_per_worker)} if spec.gpus_per_worker else {})}
                       for _ in range(spec.workers)]
            # Detached: the notebook's Ray Client job ending must not take the workers' resources with it.
            group = placement_group(bundles, strategy=spec.placement_strategy, name=_group_name(spec.name, self.attempt),
                                    lifetime="detached")
            self._group = ([], group)
            self._wait(group.ready(), spec.placement_timeout_s, on_timeout=lambda: _Failure(
                None, "resources",
                f"the cluster could not place {spec.workers} workers with {spec.cpus_per_worker} CPU"
                f" and {spec.gpus_per_worker} GPU each within {spec.placement_timeout_s:.0f} s: "
                f"{_resource_picture()}. Stop other runs, ask for fewer workers, or add nodes.",
                retriable=False))
            self._set_state(RunState.STARTING)
            actors = []
            for rank in range(spec.workers):
                actor = ray.remote(TrainWorker).options(
                    num_cpus=spec.cpus_per_worker, num_gpus=spec.gpus_per_worker, max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
                    name=f"nbtrain-worker:{spec.name}:{self.attempt}:{rank}", namespace=NAMESPACE,
                    runtime_env={"env_vars": spec.env} if spec.env else None,
                ).remote()
                actors.append(actor)
            self._group = (actors, group)
            places = self._wait([a.where.remote() for a in actors], WORKER_START_TIMEOUT_S,
                                on_timeout=lambda: _Failure(None, "startup", "the workers did not start within "
                                                            f"{WORKER_START_TIMEOUT_S:.0f} s"))
            payloads = self._payloads(places)
            with self._lock:
                for rank, place in enumerate(places):
                    self.workers[rank] = {
                        "rank": rank, "node": place["node_ip"], "hostname": place["hostname"], "pid": place["pid"],
                        "device": payloads[rank]["device_name"], "state": WorkerState.STARTING, "step": 0,
                        "samples_per_s": None, "rss_mb": None, "gpu_mem_mb": None,
                        "last_heartbeat": time.time(), "last_progress": time.time(), "attempt": self.attempt,
                        "malloc_tuned": place["malloc_tuned"],
                    }
            refs = [actor.run.remote(payload) for actor, payload in zip(actors, payloads)]
            self._set_state(RunState.RUNNING)
            return self._watch(refs)
        except _StopRequested:
            self._teardown()
            return "stopped"
        except _AttemptFailed as failed:
            self._teardown()
            return [failed.failure]
        finally:
            self._teardown()

    def _wait(self, refs: Any, timeout: float, on_timeout: Any) -> Any:
        single = not isinstance(refs, list)
        pending = [refs] if single else list(refs)
        deadline = time.time() + timeout
        while True:
            if self._stop_event.is_set():
                raise _StopRequested()
            ready, not_ready = ray.wait(pending, num_returns=len(pending), timeout=0.25)
            if not not_ready:
                try:
                    values = ray.get(pending)
                except ray.exceptions.RayActorError as exc:
                    raise _AttemptFailed(_Failure(None, "startup", f"a worker died while starting: {exc}")) from exc
                return values[0] if single else values
            if time.time() > deadline:
                raise _AttemptFailed(on_timeout())

    def _payloads(self, places: list[dict[str, Any]]) -> list[dict[str, Any]]:
        spec = self.spec
        layout = layout_ranks(places, spec.gpus_per_worker)
        datasets = self._split_datasets()
        return [{
            **layout[rank],
            "rank": rank, "world_size": spec.workers, "attempt": self.attempt, "config": spec.config,
            "run_name": spec.name, "supervisor": self._handle, "flush_interval_s": spec.flush_interval_s,
            "storage": spec.storage, "weights_only": spec.checkpoint_weights_only,
            "backend": spec.resolved_backend, "master_addr": places[0]["node_ip"],
            "master_port": places[0]["port"], "collective_timeout_s": spec.collective_timeout_s,
            "fn_bytes": spec.fn_bytes, "fn_takes_config": spec.fn_takes_config,
            "cpus_per_worker": spec.cpus_per_worker, "sources": spec.sources,
            "datasets": {name: shards[rank] for name, shards in datasets.items()},
        } for rank in range(len(places))]

    def _split_datasets(self) -> dict[str, list[Any]]:
        if not self.spec.datasets:
            return {}
        return {name: dataset.streaming_split(self.spec.workers, equal=True)
                for name, dataset in self.spec.datasets.items()}

    def _watch(self, refs: list[Any]) -> list[_Failure] | str | None:
        spec = self.spec
        pending = list(refs)
        results: dict[int, bytes] = {}
        failures: list[_Failure] = []
        first_failure_at: float | None = None
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
            for ref in ready:
                rank = refs.index(ref)
                failure = self._outcome(rank, ref, results)
                if failure is not None:
                    failures.append(failure)
                    first_failure_at = first_failure_at or time.time()
            if first_failure_at is not None and (not pending or time.time() - first_failure_at > FAILURE_GATHER_S):
                return _order_failures(failures)
            if self._stop_event.is_set():
                return "stopped"
            if self._nan_event.is_set():
                return [_Failure(None, "nan", "a reported metric became NaN and stop_on_nan is set", retriable=False)]
            stalled = self._check_stalls()
            if stalled is not None:
                return [stalled]
        self._results = [results[rank] for rank in range(spec.workers)]
        return None

    def _outcome(self, rank: int, ref: Any, results: dict[int, bytes]) -> _Failure | None:
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            with self._lock:
                worker = self.workers.get(rank, {})
                worker["state"] = WorkerState.DEAD
            cause = _short_death_cause(exc)
            return _Failure(rank, "died", f"Rank {rank}'s worker process died (pid {worker.get('pid')} on "
                                          f"{worker.get('node')}): {cause}")
        with self._lock:
            worker = self.workers.get(rank, {})
            if outcome["ok"]:
                worker["state"] = WorkerState.FINISHED
                results[rank] = outcome["result"]
                return None
            worker["state"] = WorkerState.FAILED
        secondary = any(marker in outcome["message"] or marker in outcome["traceback"] for marker in _SECONDARY_MARKERS)
        return _Failure(rank, "raised", f"Rank {rank} raised {outcome['type']} at step {outcome['step']}: "
                                        f"{outcome['message']}", outcome["traceback"], secondary=secondary)

    def _check_stalls(self) -> _Failure | None:
        timeout = self.spec.stall_timeout_s
        now = time.time()
        with self._lock:
            for rank, worker in self.workers.items():
                if worker["state"] not in (WorkerState.RUNNING, WorkerState.STARTING):
                    continue
                quiet = now - (worker.get("last_progress") or now)
                if quiet > timeout:
                    worker["state"] = WorkerState.STALLED
                    message = (f"Rank {rank} made no progress for {quiet:.0f} s (stall_timeout={timeout:g} s); "
                               f"it may be stuck in a collective or in data loading.")
                    self.events.append({"time": now, "kind": "stall", "message": message, "attempt": self.attempt})
                    self._storage.append("events", [self.events[-1]])
                    if self.spec.on_stall in ("fail", "restart"):
                        return _Failure(rank, "stalled", message, retriable=self.spec.on_stall == "restart")
        return None

    def _teardown(self) -> None:
        group = self._group
        self._group = None
        if group is None:
            return
        actors, pg = group
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001
            pass
        with self._lock:
            for worker in self.workers.values():
                if worker["state"] in (WorkerState.RUNNING, WorkerState.STARTING, WorkerState.STALLED):
                    worker["state"] = WorkerState.STOPPED


class _AttemptFailed(Exception):
    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.summary)
        self.failure = failure


def layout_ranks(places: list[dict[str, Any]], gpus_per_worker: float) -> list[dict[str, Any]]:
    """Local ranks, node ranks and GPU visibility for each rank, from where the workers landed.

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


def _group_name(run_name: str, attempt: int) -> str:
    return f"nbtrain:{run_name}:{attempt}"


def _remove_leftover_group(run_name: str, attempt: int) -> None:
    from ray.util import get_placement_group

    try:
        remove_placement_group(get_placement_group(_group_name(run_name, attempt)))
    except Exception:  # noqa: BLE001 - nothing left over
        pass


def _nan_keys(row: dict[str, Any]) -> list[str]:
    return [k for k, v in row.items() if isinstance(v, float) and math.isnan(v)]


def _has_nan(row: dict[str, Any]) -> bool:
    return any(isinstance(v, float) and math.isnan(v) for v in row.values())


def _gpu_sort_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), gpu_id) if gpu_id.isdigit() else (1 << 30, gpu_id)


def _short_death_cause(exc: Exception) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "killed" in line.lower() or "exit" in line.lower() or "died" in line.lower() or "SIG" in line:
            return line.strip()[:300]
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _order_failures(failures: list[_Failure]) -> list[_Failure]:
    primary = [f for f in failures if not f.secondary]
    if not primary:  # every rank broke on the collective: keep them all as causes
        for failure in failures:
            failure.secondary = False
        return failures
    return primary + [f for f in failures if f.secondary]


def _failure_headline(failures: list[_Failure]) -> str:
    primary = [f for f in failures if not f.secondary] or failures
    return "; ".join(f.summary for f in primary)


def _format_error(failures: list[dict[str, Any]], spec: RunSpec, attempt: int, failed_attempts: int) -> str:
    latest = [f for f in failures if f["attempt"] == attempt]
    primary = [f for f in latest if not f["secondary"]] or latest
    others = spec.workers - len({f["rank"] for f in primary if f["rank"] is not None})
    lines = [f["summary"] for f in primary]
    if any(f["rank"] is not None for f in primary):
        lines.append(f"The other {others} worker{'s were' if others != 1 else ' was'} stopped; fix the code and re-run."
                     if others else "Fix the code and re-run.")
    if spec.max_failures:
        lines.append(f"The run failed {failed_attempts} time(s), more than max_failures={spec.max_failures}.")
        earlier = [f for f in failures if f["attempt"] != attempt and not f["secondary"]]
        lines.extend(f"  attempt {f['attempt']}: {f['summary']}" for f in earlier)
    for failure in primary:
        if failure["traceback"]:
            lines.append(f"\n--- rank {failure['rank']} traceback (attempt {failure['attempt']}) ---\n{failure['traceback'].rstrip()}")
    return "\n".join(lines)


def _resource_picture() -> str:
    total = ray.cluster_resources()
    free = ray.available_resources()
    parts = [f"{key} {free.get(key, 0):g} free of {total[key]:g}" for key in ("CPU", "GPU") if key in total]
    return ", ".join(parts) or "no CPU/GPU resources"
