"""The supervisor's face to the ranks: their pushes, checkpoints and post-mortems, their standing question for
the notebook's commands and their answers, and a guard's trip. Called by each rank's session, its steering
listener, and the push relays and command questions of its node (:mod:`nbtrain._cluster.relay`)."""

from __future__ import annotations

from typing import Any

import ray

from nbtrain._cluster.commands import Command, Heartbeat
from nbtrain._cluster.relay.push_relay import Push
from nbtrain._cluster.storage import post_mortems
from nbtrain._cluster.storage.run_storage import kept_checkpoint, prune_checkpoints
from nbtrain._cluster.supervisor.supervisor_base import RANKS, Found, SupervisorBase
from nbtrain._exceptions import StorageError


class ForRanks(SupervisorBase):
    """The methods the ranks call (over Ray, by these names)."""

    def push(self, rank: int, attempt: int, seq: int, rows: list[dict[str, Any]],
             beat: Heartbeat, logs: list[tuple[str, float, str]]) -> None:
        """Rows, heartbeat and log text from one rank; called fire-and-forget by its flusher."""
        nan_rows = self._feed.accept(rank, attempt, seq, rows, logs)
        if nan_rows is None:  # a push seen before
            return
        self._table.beat(rank, attempt, beat)
        self._run.phases.rank_reached(rank, attempt, beat.phases)
        self._run.report_batch(rows, nan_rows)

    def push_many(self, pushes: list[Push]) -> None:
        """The pushes of one node's ranks on one tick, from its :mod:`~nbtrain._cluster.relay.push_relay`."""
        for push in pushes:
            self.push(*push)

    def record_checkpoint(self, meta: dict[str, Any], data: bytes | None, path: str | None) -> None:
        """Rank 0's checkpoint: ``data`` to keep here, or the ``path`` (or pyarrow.fs URI) it wrote in ``storage=``."""
        resumed_from = (self._run.resume_from or {}).get("path")
        if data is not None:
            path = self._storage.write_checkpoint(meta, data, keep=resumed_from)
        with self._feed.lock:
            self._run.checkpoint = {**meta, "path": path}
            self._run.persist()
        self._feed.event("checkpoint", f"checkpoint saved at step {meta['step']} (attempt {meta['attempt']})",
                         self._run.attempt)
        if data is None and path is not None:
            try:
                prune_checkpoints(path, keep=resumed_from)
            except (OSError, StorageError) as exc:  # the new checkpoint is recorded: only old ones stay behind
                self._feed.event("storage", f"older checkpoints could not be deleted: {exc}", self._run.attempt)

    def keep_post_mortem(self, attempt: int, rank: int, data: bytes) -> None:
        """A failing rank's post-mortem for ``%ray_debug``, kept in the run's storage (before its failure is known)."""
        post_mortems.write(self._storage.dir, attempt, rank, data)

    @ray.method(concurrency_group=RANKS)
    def control(self, attempt: int, seen: int, wait_s: float) -> tuple[bool, list[Command]]:
        """Each rank's standing question (see rank/rank_steering), or a node's relay's for its ranks: the notebook's
        commands after the ``seen``-th as soon as there are any (else after ``wait_s``), and whether a checkpoint
        is wanted (elastic)."""
        commands = self._run.steering.since(seen, wait_s)
        return self._run.checkpoint_wanted(attempt), commands

    def standing_questions(self) -> int:
        """How many questions for commands wait on this supervisor now (each holds one of its threads)."""
        return self._run.steering.questions

    def command_learnt(self, attempt: int, rank: int, command_ids: list[int], first_step: int) -> None:
        """A rank learnt these commands and can apply them from ``first_step`` on (see run_steering)."""
        self._run.steering.learnt(attempt, rank, command_ids, first_step)

    @ray.method(concurrency_group=RANKS)
    def step_for(self, attempt: int, command_id: int, rank: int, step: int) -> int:
        """The step every rank applies a command at, asked by a rank that reached ``step`` with it due: settled
        by the first to ask (it may wait a little for the others' word; see run_steering)."""
        return self._run.steering.step_for(attempt, command_id, rank, step, self._table.live_ranks(),
                                           self._table.steering_now())

    def command_applied(self, command_id: int, rank: int, step: int, before: dict[str, Any] | None,
                        when: float) -> None:
        self._run.steering.applied(command_id, rank, step, before, when, self._run.world_size)

    def command_result(self, command_id: int, rank: int, ok: bool, value: Any) -> None:
        self._run.command_result(command_id, rank, ok, value)

    def guard_tripped(self, attempt: int, rank: int, branch: int, step: int, kind: str, message: str) -> None:
        """A rank's guard saw trouble (see guard_decisions): its action is issued to every rank, or the run stops."""
        self._run.guard_tripped(attempt, branch, step, kind, message)

    def checkpoint_at(self, step: int) -> Found | None:
        """The checkpoint kept at ``step`` (or the latest before it), for a rank's ``@on_rewind`` function."""
        with self._feed.lock:
            checkpoint = kept_checkpoint(self._run.checkpoint, step)
        return self._read_checkpoint(checkpoint)

    def checkpoint_to_resume(self) -> Found | None:
        """The checkpoint the current attempt started from: what every rank's ``load_checkpoint()`` gets,
        however late in the attempt it asks. Not one rank 0 saved since: a rank slower to start would
        begin at another step than the others."""
        with self._feed.lock:
            checkpoint = self._run.resume_from
        return self._read_checkpoint(checkpoint)
