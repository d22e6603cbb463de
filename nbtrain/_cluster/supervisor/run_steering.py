"""The supervisor's side of steering a live run: it numbers the notebook's commands, picks their step,
keeps them in the run's history, and hands them to the ranks (see :mod:`nbtrain._cluster.commands`).

The step: every rank must apply a change at the same step, so the supervisor picks one a little ahead
of the furthest rank — far enough that the command reaches each rank (each holds a standing question, answered at once)
before it gets there (:func:`nbtrain._cluster.command_kinds.kind.step_ahead`); what else a kind checks or
completes here is its own module's. Every rank says at which step it applied it; if they disagree (a rank was held
up longer than the lead), the run's events say so. The ranks measure their rate of steps themselves,
on each heartbeat, so the lead is right from the first seconds of a run. A command issued while no rank runs (a restart)
is applied at the next attempt's first step. The changes made so far are the run's steered state, which
every new attempt takes as one fact (:meth:`RunSteering.new_attempt`): its ranks re-apply them from their
payload at the steps they were applied at, unless the checkpoint they loaded their optimizers from holds
them already, and report none of them as landing again; the run's events say once what the attempt follows.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.command_kinds.kind import Issuing
from nbtrain._cluster.command_kinds.table import command_kind, describe, learn
from nbtrain._cluster.commands import (
    ADJUST,
    GUARD,
    PATCH,
    PAUSE,
    RESUME,
    REWIND,
    STOP_AFTER_EPOCH,
    Command,
    SteeringBeat,
)
from nbtrain._cluster.supervisor.guard_decisions import GuardDecisions


class RunSteering:
    """The commands of one run; thread-safe (pushes, polls and the notebook's calls come on many threads)."""

    def __init__(self, record: Callable[..., None], persist: Callable[[], None],
                 saved: list[dict[str, Any]] | None = None,
                 rewound: Callable[[int], None] | None = None) -> None:
        self.record = record       # (kind, message, **fields): an event in the run's history
        self._persist = persist    # the run's state, commands included, to its storage
        self.rewound = rewound     # (step): rank 0 went back to its point at step (the run's checkpoint follows)
        self.commands: list[Command] = [_loaded(saved_command) for saved_command in saved or []]
        self.guards = GuardDecisions(self)
        self._applied_by: dict[int, dict[int, int]] = {}       # command id -> rank -> step
        self._results: dict[int, dict[int, tuple[bool, Any]]] = {}
        self._changed = threading.Condition()
        self.questions = 0  # the ranks' (or their nodes' relays') questions waiting now: one supervisor thread each

    def start_with_guard(self, guard: dict[str, Any]) -> None:
        """A new run's guards (``launch(guard=...)``), in force from its first step."""
        with self._changed:
            self.commands.append(Command(id=len(self.commands) + 1, kind=GUARD, args=guard, at_step=0,
                                         issued=time.time()))

    def start_with(self, settings: dict[str, Any]) -> None:
        """A new run's first command: these optimizer settings before the first update (a fork's config)."""
        with self._changed:
            self.commands.append(Command(id=len(self.commands) + 1, kind=ADJUST, args={**settings, "group": None},
                                         at_step=0, issued=time.time()))

    def start_with_patch(self, source: str) -> None:
        """A fork's patch of its parent, rebound from the new run's first step boundary."""
        args = command_kind(PATCH).check({"source": source, "new": True})
        with self._changed:
            self.commands.append(Command(id=len(self.commands) + 1, kind=PATCH, args=args, at_step=0,
                                         issued=time.time()))

    # ------------------------------------------------------------------ the notebook asks
    def issue(self, kind: str, args: dict[str, Any], running: dict[int, SteeringBeat], live: bool,
              attempt: int | None = None, definition: bytes | None = None) -> Command:
        """A new command, with the step it takes effect at; ``running``: what each rank taking steps last said
        (the worker table's :meth:`~nbtrain._cluster.supervisor.worker_table.WorkerTable.steering_now`); ``definition``:
        a kind not nbtrain's own, as the notebook sent it. ``ValueError`` says why the kind refuses it now."""
        command_kind_ = learn(kind, definition)
        args = command_kind_.issued_args(args, Issuing(self, running, live, attempt))
        with self._changed:
            command = Command(id=len(self.commands) + 1, kind=kind, args=args, at_step=command_kind_.step(running),
                              issued=time.time(), definition=definition)
            self.commands.append(command)
            self._changed.notify_all()
        self._persist()
        command_kind_.on_issued(self, command)
        return command

    def new_attempt(self, attempt: int) -> None:
        """A new attempt starts: the run's steering state goes with it as one fact, not as commands landing again.

        Its ranks re-apply the changes made so far from their payload, at the steps they were applied at, and say
        nothing of it (a rank of the new attempt that re-applies a change at its own step is no disagreement);
        this says once what the new attempt follows. A rewind that no rank of the last attempt reached is
        dropped, with why: the new attempt resumes from the run's latest checkpoint, and a later rewind is not
        refused as "under way"."""
        with self._changed:
            self._applied_by.clear()
            dropped = []
            for index, command in enumerate(self.commands):
                if command.kind == REWIND and command.applied_step is None and command.dropped is None:
                    why = (f"attempt {attempt - 1} ended before its ranks reached step {command.at_step}; attempt "
                           f"{attempt} resumes from the run's latest checkpoint. Ask again once it runs.")
                    self.commands[index] = dataclasses.replace(command, dropped=why)
                    dropped.append(self.commands[index])
            follows = [command for command in self.commands if command_kind(command.kind).replayed == "each"
                       and command.applied_step is not None and not command.superseded and command.dropped is None]
            self._changed.notify_all()
        if dropped:
            self._persist()
        for command in dropped:
            self.record("rewind", f"the rewind to step {command.rewind[0]} was not applied: {command.dropped}")
        if attempt > 1 and follows:
            self.record("change", f"attempt {attempt} follows the run's changes: "
                                  + "; ".join(describe(command) for command in follows))

    def guard(self) -> dict[str, Any]:
        """The guards in force (``{}``: none)."""
        return next((dict(c.args) for c in reversed(self.commands) if c.kind == GUARD), {})

    def rewinds(self) -> list[Command]:
        return [c for c in self.all() if c.kind == REWIND]

    def paused(self) -> bool:
        """Whether the last pause was not resumed (it may not have been reached yet: the ranks' word lags)."""
        last = next((command.kind for command in reversed(self.commands) if command.kind in (PAUSE, RESUME)), None)
        return last == PAUSE

    def stop_after_epoch(self) -> int | None:
        """The epoch ``run.stop(after="epoch")`` named, if it was asked."""
        return next((command.epoch for command in reversed(self.commands) if command.kind == STOP_AFTER_EPOCH), None)

    # ------------------------------------------------------------------ the ranks ask and answer
    def since(self, seen: int, wait_s: float = 0.0) -> list[Command]:
        """The commands after the ``seen``-th, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            self.questions += 1
            try:
                while len(self.commands) <= seen and (left := deadline - time.monotonic()) > 0:
                    self._changed.wait(left)
                return self.commands[seen:]
            finally:
                self.questions -= 1

    def all(self) -> list[Command]:
        with self._changed:
            return list(self.commands)

    def saved(self) -> list[dict[str, Any]]:
        """The commands as the run's saved state keeps them (read back by ``RunSteering(saved=...)``)."""
        return [command.as_dict() for command in self.all()]

    def applied(self, command_id: int, rank: int, step: int, before: dict[str, Any] | None, when: float,
                world_size: int) -> None:
        with self._changed:
            command = self.commands[command_id - 1]
            kind = command_kind(command.kind)
            steps = self._applied_by.setdefault(command_id, {})
            steps[rank] = step
            if kind.goes_back:  # each rank's own clock: its rows before this time, past the step, are left
                command = dataclasses.replace(command, rank_times={**(command.rank_times or {}), rank: when})
                self.commands[command_id - 1] = command
            rewound = rank == 0 and command.applied_step is None and kind.goes_back
            if rank == 0 and command.applied_step is None:
                command = dataclasses.replace(command, applied_step=step, applied=when, before=before)
                self.commands[command_id - 1] = command
                message = describe(command)
            else:
                message = ""
            if rewound:
                self._supersede(command)
            disagree = len(steps) == world_size and len(set(steps.values())) > 1
            self._changed.notify_all()
        if rewound and self.rewound is not None:
            self.rewound(command.rewind[0])
        if message or kind.goes_back:
            self._persist()
        if message:
            self.record(kind.event, message)
        if disagree:
            where = ", ".join(f"rank {r} at step {s}" for r, s in sorted(steps.items()))
            self.record("change", f"command {command_id} was applied at different steps ({where}): a rank was "
                                   "held up longer than the lead; the replicas may differ from here on.")

    def _supersede(self, rewind: Command) -> None:
        """With the lock held: the changes applied past the step ``rewind`` goes back to belong to the branch it
        leaves; a new attempt does not apply them again."""
        to_step = rewind.rewind[0]
        for index, command in enumerate(self.commands[:rewind.id - 1]):
            if command.applied_step is not None and command.applied_step > to_step \
                    and not command_kind(command.kind).survives_rewind and not command.superseded:
                self.commands[index] = dataclasses.replace(command, superseded=True)

    def result(self, command_id: int, rank: int, ok: bool, value: Any) -> None:
        """A rank's answer; rank 0's refusal of a kind that then never applies (a patch) drops it, with why."""
        with self._changed:
            self._results.setdefault(command_id, {})[rank] = (ok, value)
            command = self.commands[command_id - 1]
            refused = rank == 0 and not ok and command_kind(command.kind).dropped_when_refused
            if refused:
                why = value["refused"] if isinstance(value, dict) and "refused" in value else value
                self.commands[command_id - 1] = dataclasses.replace(command, dropped=str(why))
            elif command.applied_step is None and rank == 0:
                self.commands[command_id - 1] = dataclasses.replace(command, applied=time.time())
            self._changed.notify_all()
        if refused:
            self._persist()

    def answered(self, command_id: int) -> set[int]:
        """The ranks that answered a command so far."""
        with self._changed:
            return set(self._results.get(command_id, {}))

    def results(self, command_id: int, ranks: list[int], wait_s: float) -> dict[int, tuple[bool, Any]]:
        """The answers of a user command's ranks so far, waiting up to ``wait_s`` for those of ``ranks``."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while not set(ranks) <= set(self._results.get(command_id, {})) \
                    and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return dict(self._results.get(command_id, {}))

    def when_applied(self, command_id: int, wait_s: float) -> Command:
        deadline = time.monotonic() + wait_s
        with self._changed:
            while self.commands[command_id - 1].applied is None and self.commands[command_id - 1].dropped is None \
                    and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return self.commands[command_id - 1]

    def changes(self) -> list[dict[str, Any]]:
        """The commands applied (or waiting), for ``run.changes`` and the curves' markers."""
        return [{**command.as_dict(), "description": describe(command)} for command in self.all()
                if command_kind(command.kind).is_change
                and (command.dropped is None or command_kind(command.kind).goes_back)]


def _loaded(saved: dict[str, Any]) -> Command:
    """A command as the run's state file kept it (JSON: a rewind's rank times keyed by text)."""
    times = saved.get("rank_times")
    return Command(**{**saved, "rank_times": {int(rank): when for rank, when in times.items()} if times else None})
