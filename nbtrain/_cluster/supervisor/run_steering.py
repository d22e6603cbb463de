"""The supervisor's side of steering a live run: it numbers the notebook's commands, proposes their step,
keeps them in the run's history, hands them to the ranks (see :mod:`nbtrain._cluster.commands`) and settles the
step every rank applies each one at.

The step: every rank must apply a change at the same step, or DDP's replicas part. The supervisor proposes one a
little ahead of the furthest rank (:func:`nbtrain._cluster.command_kinds.kind.step_ahead`), so the command usually
reaches each rank (each holds a standing question, answered at once) before it gets there. Usually is not enough on
a loaded machine, so the proposal is only that: each rank says from which step on it can apply the command as it
learns it (:meth:`RunSteering.learnt`), and asks, as it reaches the step, whether that is the step
(:meth:`RunSteering.step_for`). The first rank to ask settles it for all: its step, once every rank said it can
apply the command there; else a later one, which every rank reaches and asks about again (a rank that learnt the
command late moves it on, it never applies it alone). What else a kind checks or completes here is its own
module's. The ranks measure their rate of steps themselves, on each heartbeat, so the proposal is right from the
first seconds of a run. A command issued while no rank runs (a restart) is settled at the next attempt's first
steps. The changes made so far are the run's steered state, which every new attempt takes as one fact
(:meth:`RunSteering.new_attempt`): its ranks re-apply them from their payload at the steps they were applied at,
unless the checkpoint they loaded their optimizers from holds them already, and report none of them as landing
again; the run's events say once what the attempt follows.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.command_kinds.kind import Issuing, step_ahead
from nbtrain._cluster.command_kinds.table import command_kind, describe, learn
from nbtrain._cluster.commands import (
    ADJUST,
    AGREE_WAIT_S,
    DECLINED,
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
        self._attempt: int | None = None                   # the attempt whose ranks settle steps (new_attempt)
        self._learnt: dict[int, dict[int, int]] = {}       # command id -> rank -> the first step it can apply it at
        self._settled: dict[int, int] = {}                 # command id -> the step every rank applies it at
        self._declined: dict[int, set[int]] = {}           # command id -> the ranks that will never apply it
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
            command = Command(id=len(self.commands) + 1, kind=kind, args=args,
                              at_step=command_kind_.step(running, self.paused()), issued=time.time(),
                              definition=definition)
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
            self._attempt, self._learnt, self._settled, self._declined = attempt, {}, {}, {}
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

    def learnt(self, attempt: int, rank: int, command_ids: list[int], first_step: int) -> None:
        """A rank learnt these commands: it can apply them from ``first_step`` on (the first of its steps whose
        hook point had not begun when they arrived), or never (:data:`DECLINED`: an exec where it has no step
        boundary), and is then not waited for."""
        with self._changed:
            if attempt != self._attempt:
                return
            for command_id in command_ids:
                if first_step == DECLINED:
                    self._declined.setdefault(command_id, set()).add(rank)
                    continue
                said = self._learnt.setdefault(command_id, {})
                said[rank] = min(said.get(rank, first_step), first_step)
            self._changed.notify_all()

    def step_for(self, attempt: int, command_id: int, rank: int, step: int, live: set[int],
                 running: dict[int, SteeringBeat]) -> int:
        """The step every rank applies a command at, asked by ``rank`` as it reaches ``step`` with the command due.

        Settled once, by the first rank to ask at the proposed step (or past it): that step, once every ``live`` rank
        (one that may still take a step: not one whose function ended; of a kind that asks some ranks, those of
        them; not one that declined it) said it can apply the command there. Else a later step, ahead of every
        rank, is proposed instead and asked about again as the ranks reach it: at once if a rank said it can apply
        it only later, or after :data:`AGREE_WAIT_S` without a rank's word (a rank whose question was answered
        that late). Every rank asks at the first step it can apply the command at, never past the proposed one,
        so none passes the settled step without knowing it. ``running``: what each stepping rank last said (for a
        later step's lead)."""
        deadline = time.monotonic() + AGREE_WAIT_S
        with self._changed:
            if attempt != self._attempt:
                return step  # an attempt on its way out: nothing of it is steered any more
            said = self._learnt.setdefault(command_id, {})
            said[rank] = min(said.get(rank, step), step)  # asking, it knows the command at this step
            command = self.commands[command_id - 1]
            if command_kind(command.kind).asks_ranks:  # an exec, a profile: those asked
                live = live & set(command.ranks)
            while command_id not in self._settled:
                command = self.commands[command_id - 1]  # another rank's question may have moved it meanwhile
                if step < command.at_step:
                    return command.at_step
                silent = live - said.keys() - self._declined.get(command_id, set())
                if not silent and max(said.values()) <= step:
                    self._settled[command_id] = step
                    self.commands[command_id - 1] = command.due_at(step)
                    self._changed.notify_all()
                    break
                left = deadline - time.monotonic()
                if max(said.values()) > step or left <= 0:  # a rank can apply it only later, or said nothing
                    later = max(step + 1, step_ahead(running, paused=False), *said.values())
                    self.commands[command_id - 1] = command.due_at(later)
                    self._changed.notify_all()
                    return later
                self._changed.wait(left)
            return self._settled[command_id]

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
            self.record("change", f"command {command_id} was applied at different steps ({where}), against the step "
                                   "the ranks settled; the replicas may differ from here on. Please report this "
                                   "as a bug in nbtrain.")

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
