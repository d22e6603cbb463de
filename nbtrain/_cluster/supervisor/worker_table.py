"""The state of every rank of the current attempt, as the dashboard's worker table shows it.

Written by the worker group (placed, finished, failed, dead, stopped), by each
rank's heartbeat (step, samples/s or steps/s, memory) and by the stall check; read by
summaries. Guarded by the supervisor's lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from nbtrain._cluster.commands import Heartbeat, SteeringBeat
from nbtrain._states import WorkerState

_LIVE = (WorkerState.STARTING, WorkerState.RUNNING, WorkerState.STALLED, WorkerState.PAUSED)
_STEPPING = (WorkerState.RUNNING, WorkerState.PAUSED, WorkerState.STALLED)  # ranks a command's step is counted from


class WorkerTable:
    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._rows: dict[int, dict[str, Any]] = {}
        self._steering: dict[int, SteeringBeat] = {}  # each rank's last word for steering (see steering_now)
        self._attempt = 0
        self._recovered: list[tuple[int, float]] = []  # stalled ranks that made progress again, and for how long not

    def reset(self, attempt: int) -> None:
        with self._lock:
            self._rows = {}
            self._steering = {}
            self._attempt = attempt
            self._recovered = []

    def add_group(self, places: list[dict[str, Any]], devices: list[str], attempt: int) -> None:
        now = time.time()
        labels = node_labels(places)
        with self._lock:
            for rank, (place, device) in enumerate(zip(places, devices)):
                self._rows[rank] = {
                    "rank": rank, "node": labels[place["node_id"]], "node_id": place["node_id"],
                    "hostname": place["hostname"], "pid": place["pid"],
                    "device": device, "state": WorkerState.STARTING, "step": 0, "samples_per_s": None,
                    "steps_per_s": None, "batch_size_known": False, "step_mark": None,
                    "rss_mb": None, "gpu_mem_mb": None, "last_heartbeat": now, "last_progress": now,
                    "attempt": attempt, "malloc_tuned": place["malloc_tuned"],
                }

    def beat(self, rank: int, attempt: int, beat: Heartbeat) -> None:
        """A rank's heartbeat; ignored if it belongs to an earlier attempt.

        ``samples_per_s`` counts only samples whose batch size is known (batches from
        ``prepare_loader`` or a dataset shard's ``iter_torch_batches``); a rank that steps
        without any has ``None`` there, and ``steps_per_s`` (from its steps between
        heartbeats at least a second apart) tells how fast it goes.
        """
        with self._lock:
            worker = self._rows.get(rank)
            if worker is None or attempt != self._attempt:
                return
            if beat.samples_per_s:
                worker["batch_size_known"] = True
            if worker.get("batch_size_known") and beat.samples_per_s is not None:
                worker["samples_per_s"] = beat.samples_per_s
            self._rate_steps(worker, beat)
            worker.update(beat.measured)
            worker.update(step=beat.step, epoch=beat.steering.epoch, last_progress=beat.last_progress,
                          last_heartbeat=beat.time)
            self._steering[rank] = beat.steering
            if beat.state == "running" and worker["state"] in (WorkerState.STARTING, WorkerState.PAUSED):
                worker["state"] = WorkerState.RUNNING
            elif beat.state == "paused" and worker["state"] in (WorkerState.RUNNING, WorkerState.STALLED):
                worker["state"] = WorkerState.PAUSED
                worker["stalled_at_progress"] = None
            stalled_at = worker.get("stalled_at_progress")
            # a stalled rank still sends heartbeats: only progress ends its stall
            if worker["state"] == WorkerState.STALLED and stalled_at is not None \
                    and worker["last_progress"] > stalled_at:
                worker["state"] = WorkerState.RUNNING
                worker["stalled_at_progress"] = None
                self._recovered.append((rank, worker["last_progress"] - stalled_at))

    @staticmethod
    def _rate_steps(worker: dict[str, Any], beat: Heartbeat) -> None:
        step, when = beat.step, beat.time
        mark: tuple[float, int] | None = worker.get("step_mark")
        if mark is None or step < mark[1]:  # first beat, or a restart from a checkpoint
            worker["step_mark"] = (when, step)
            return
        mark_time, mark_step = mark
        if when - mark_time >= 1.0:
            worker["steps_per_s"] = (step - mark_step) / (when - mark_time)
            worker["step_mark"] = (when, step)

    def steering_summary(self) -> dict[str, Any]:
        """The run's summary of its ranks' last word for steering, whatever their state now: ``paused_at``
        (the step a pause holds them at), ``hyper`` (the lowest rank's optimizer settings) and ``restore_points``
        (the steps every rank can rewind to now)."""
        with self._lock:
            said = [self._steering[rank] for rank in sorted(self._steering)]
        points = [set(s.restore_points) for s in said]
        return {"paused_at": min((s.paused_at for s in said if s.paused_at is not None), default=None),
                "hyper": next((s.settings for s in said if s.settings), None),
                "restore_points": sorted(set.intersection(*points)) if points else []}

    def steering_now(self) -> dict[int, SteeringBeat]:
        """What each rank that takes steps (running, paused or stalled) last said for steering, by rank; a rank
        that has not measured its rate yet has the table's steps/s."""
        with self._lock:
            found = {}
            for rank in sorted(self._rows):
                worker, said = self._rows[rank], self._steering.get(rank)
                if worker["state"] not in _STEPPING:
                    continue
                if said is None:
                    said = SteeringBeat(step=int(worker.get("step") or 0), rate=None, epoch=0)
                if said.rate is None and worker.get("steps_per_s") is not None:
                    said = dataclasses.replace(said, rate=worker["steps_per_s"])
                found[rank] = said
            return found

    def mark(self, rank: int, state: WorkerState) -> dict[str, Any]:
        """Set one rank's state; returns a copy of its row (empty if unknown)."""
        with self._lock:
            worker = self._rows.get(rank)
            if worker is None:
                return {}
            worker["state"] = state
            return dict(worker)

    def note(self, rank: int, **fields: Any) -> None:
        """Set fields of one rank's row (``straggler``, by the controller's straggler watch)."""
        with self._lock:
            worker = self._rows.get(rank)
            if worker is not None:
                worker.update(fields)

    def stop_live(self) -> None:
        with self._lock:
            for worker in self._rows.values():
                if worker["state"] in _LIVE:
                    worker["state"] = WorkerState.STOPPED

    def all_pushed_after(self, moment: float) -> bool:
        """Whether every live rank has sent a push made after ``moment`` (its clock): rows it reported
        before then have all arrived."""
        with self._lock:
            return all(w["last_heartbeat"] > moment for w in self._rows.values() if w["state"] in _LIVE)

    def live_ranks(self) -> set[int]:
        """The ranks that may still take a step: starting, running, stalled or paused (a command's step is settled
        with each of them)."""
        with self._lock:
            return {rank for rank, w in self._rows.items() if w["state"] in _LIVE}

    def running_ranks(self) -> list[int]:
        with self._lock:
            return [rank for rank, w in self._rows.items() if w["state"] in (WorkerState.RUNNING, WorkerState.STALLED)]

    def newly_stalled(self, timeout_s: float) -> list[tuple[int, float]]:
        """Ranks quiet for longer than ``timeout_s`` (marked stalled now, once per stall), with how long."""
        now = time.time()
        found = []
        with self._lock:
            for rank, worker in self._rows.items():
                if worker["state"] not in (WorkerState.RUNNING, WorkerState.STARTING):
                    continue
                quiet = now - (worker.get("last_progress") or now)
                if quiet > timeout_s:
                    worker["state"] = WorkerState.STALLED
                    worker["stalled_at_progress"] = worker.get("last_progress") or now
                    found.append((rank, quiet))
        return found

    def newly_recovered(self) -> list[tuple[int, float]]:
        """Stalled ranks that made progress since the last call, with how long they had made none."""
        with self._lock:
            found, self._recovered = self._recovered, []
        return found

    def snapshot(self) -> list[dict[str, Any]]:
        """Plain dicts for the notebook: states as text, heartbeat age in seconds."""
        now = time.time()
        with self._lock:
            rows = []
            for rank in sorted(self._rows):
                worker = dict(self._rows[rank])
                worker.pop("step_mark", None)
                worker["state"] = str(worker["state"])
                beat = worker.get("last_heartbeat")
                worker["heartbeat_age_s"] = now - beat if beat else None
                rows.append(worker)
            return rows


def node_labels(places: list[dict[str, Any]]) -> dict[str, str]:
    """What the worker table calls each node: its IP, plus the start of its Ray node id where two
    nodes share an IP (several nodes on one machine, as on the loopback cluster)."""
    ids_by_ip: dict[str, set[str]] = {}
    for place in places:
        ids_by_ip.setdefault(place["node_ip"], set()).add(place["node_id"])
    return {place["node_id"]: place["node_ip"] if len(ids_by_ip[place["node_ip"]]) == 1
            else f"{place['node_ip']} (node {place['node_id'][:6]})" for place in places}

