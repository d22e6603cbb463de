"""The supervisor's side of steering a live run: it numbers the notebook's commands, picks their step,
keeps them in the run's history, and hands them to the ranks (see :mod:`nbtrain._cluster.commands`).

The step: every rank must apply a change at the same step, so the supervisor picks one a little ahead
of the furthest rank — far enough that the command reaches each rank (each holds a standing question, answered at once)
before it gets there: :data:`LEAD_S` of steps at the run's current rate, and at least
:data:`MIN_LEAD_STEPS`. Every rank says at which step it applied it; if they disagree (a rank was held
up longer than the lead), the run's events say so. The ranks measure their rate of steps themselves,
on each heartbeat, so the lead is right from the first seconds of a run. A command issued while no rank runs (a restart)
is applied at the next attempt's first step. The changes made so far are the run's steered state, which
every new attempt takes as one fact (:meth:`RunSteering.new_attempt`): its ranks re-apply them from their
payload at the steps they were applied at, unless the checkpoint they loaded their optimizers from holds
them already, and report none of them as landing again; the run's events say once what the attempt follows.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.commands import (
    ADJUST,
    AS_SOON_AS_BACK,
    GUARD,
    NO_SETTING_GIVEN,
    NOT_CHANGES,
    PAUSE,
    PROFILE,
    RESUME,
    REWIND,
    STACKS,
    STOP_AFTER_EPOCH,
    Command,
    SteeringBeat,
)
from nbtrain._cluster.run.guard_decisions import GuardDecisions

LEAD_S = 0.5          # how far ahead of the furthest rank a command's step is, in time at the current rate
MIN_LEAD_STEPS = 3


class RunSteering:
    """The commands of one run; thread-safe (pushes, polls and the notebook's calls come on many threads)."""

    def __init__(self, record: Callable[[str, str], None], persist: Callable[[], None],
                 saved: list[dict[str, Any]] | None = None,
                 rewound: Callable[[int], None] | None = None) -> None:
        self.record = record       # (kind, message): an event in the run's history
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

    # ------------------------------------------------------------------ the notebook asks
    def issue(self, kind: str, args: dict[str, Any], running: dict[int, SteeringBeat], live: bool) -> Command:
        """A new command, with the step it takes effect at; ``running``: what each rank taking steps last said
        (the worker table's :meth:`~nbtrain._cluster.run.worker_table.WorkerTable.steering_now`)."""
        if kind == ADJUST:
            self._check_adjust(args, running, live)
        if kind == REWIND:
            args = self._rewind_to(args, running)
        if kind in (STACKS, PROFILE):
            args = {**args, "ranks": _asked_ranks(kind, args.get("ranks"), sorted(running))}
        if kind == PAUSE and self.paused():
            raise ValueError("the run is paused already (or about to be); resume it first.")
        if kind == RESUME and not self.paused():
            raise ValueError("the run is not paused; nothing to resume.")
        if kind == STOP_AFTER_EPOCH:
            stepping = any(said.step > 1 for said in running.values())  # a loader or integration says so by then
            if stepping and not any(said.epochs_counted for said in running.values()):
                raise ValueError("its ranks count no epochs: stop(after='epoch') needs a loader from "
                                 "nbtrain.prepare_loader (or Lightning's / Hugging Face's trainer through "
                                 "nbtrain); stop() it, or checkpoint_now() first.")
            args = {**args, "epoch": max((said.epoch for said in running.values()), default=0)}
        with self._changed:
            command = Command(id=len(self.commands) + 1, kind=kind, args=args, at_step=_step_ahead(running),
                              issued=time.time())
            self.commands.append(command)
            self._changed.notify_all()
        self._persist()
        if kind == GUARD:  # in force as each rank learns it: no step to wait for
            self.record("guard", command.describe())
        return command

    def _check_adjust(self, args: dict[str, Any], running: dict[int, SteeringBeat], live: bool) -> None:
        settings = {key: value for key, value in args.items() if key != "group"}
        if not settings:
            raise ValueError(NO_SETTING_GIVEN)
        known = next((said.settings for said in running.values() if said.settings), None)
        if known is None:
            if live and running:
                raise ValueError("its code gives nbtrain no optimizer to adjust. Call "
                                 "nbtrain.prepare_optimizer(optimizer) or nbtrain.steerable(optimizer) in the "
                                 "training function (Lightning: nbtrain.lightning.trainer(); Hugging Face: "
                                 "nbtrain.huggingface's callback).")
            return  # no rank running yet: checked by the ranks' optimizers when it applies
        missing = [key for key in settings if key not in known]
        if missing:
            raise ValueError(f"its optimizer has no {', '.join(missing)}; it has {', '.join(sorted(known))}.")
        group = args.get("group")
        if group is not None and not (isinstance(group, int) and 0 <= group < len(known.get("lr", [None]))):
            raise ValueError(f"group={group!r}: its optimizers have {len(known.get('lr', []))} param groups "
                             "(0-based).")

    def _rewind_to(self, args: dict[str, Any], running: dict[int, SteeringBeat]) -> dict[str, Any]:
        """A rewind's args with the step it goes back to: the latest restore point at or before the step asked
        that every rank running has (they take them at the same checkpoints)."""
        if not running:
            raise ValueError("no rank is running now to rewind (it may be starting or restarting); ask again once "
                             "its ranks run.")
        under_way = [c for c in self.commands if c.kind == REWIND and c.applied_step is None and c.dropped is None]
        if under_way:
            raise ValueError(f"a rewind to step {under_way[-1].rewind[0]} is under way; ask again once it is done.")
        refusal = next((said.rewind_refusal for said in running.values() if said.rewind_refusal), None)
        if refusal:
            raise ValueError(refusal)
        common = set.intersection(*(set(said.restore_points) for said in running.values()))
        asked = args.get("step")
        at_or_before = sorted(step for step in common if asked is None or step <= asked)
        if not at_or_before:
            if not common:
                raise ValueError("its ranks have no restore point yet in the epoch they are in: each rank takes "
                                 "one at each nbtrain.save_checkpoint (call it on every rank), or ask "
                                 "run.checkpoint_now().")
            raise ValueError(f"it has no checkpoint at or before step {asked} to rewind to; its ranks can go back to "
                             f"step {', '.join(map(str, sorted(common)))} (the last checkpoints of the epoch they are "
                             "in).")
        to_step = at_or_before[-1]
        skip = args.get("skip")
        if skip is None:  # a guard's: through the batch that tripped
            skip = max(int(args.get("through", to_step)) - to_step, 0)
        return {**{key: value for key, value in args.items() if key not in ("step", "through")},
                "to_step": to_step, "skip": int(skip)}

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
            follows = [command for command in self.commands
                       if command.kind == ADJUST and command.applied_step is not None and not command.superseded]
            self._changed.notify_all()
        if dropped:
            self._persist()
        for command in dropped:
            self.record("rewind", f"the rewind to step {command.rewind[0]} was not applied: {command.dropped}")
        if attempt > 1 and follows:
            self.record("change", f"attempt {attempt} follows the run's changes: "
                                  + "; ".join(command.describe() for command in follows))

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
            steps = self._applied_by.setdefault(command_id, {})
            steps[rank] = step
            if command.kind == REWIND:  # each rank's own clock: its rows before this time, past the step, are left
                command = dataclasses.replace(command, rank_times={**(command.rank_times or {}), rank: when})
                self.commands[command_id - 1] = command
            rewound = rank == 0 and command.applied_step is None and command.kind == REWIND
            if rank == 0 and command.applied_step is None:
                command = dataclasses.replace(command, applied_step=step, applied=when, before=before)
                self.commands[command_id - 1] = command
                message = command.describe()
            else:
                message = ""
            if rewound:
                self._supersede(command)
            disagree = len(steps) == world_size and len(set(steps.values())) > 1
            self._changed.notify_all()
        if rewound and self.rewound is not None:
            self.rewound(command.rewind[0])
        if message or command.kind == REWIND:
            self._persist()
        if message:
            self.record("rewind" if command.kind == REWIND else "change", message)
        if disagree:
            where = ", ".join(f"rank {r} at step {s}" for r, s in sorted(steps.items()))
            self.record("change", f"command {command_id} was applied at different steps ({where}): a rank was "
                                   "held up longer than the lead; the replicas may differ from here on.")

    def _supersede(self, rewind: Command) -> None:
        """With the lock held: the changes applied past the step ``rewind`` goes back to belong to the branch it
        leaves; a new attempt does not apply them again."""
        to_step = rewind.rewind[0]
        for index, command in enumerate(self.commands[:rewind.id - 1]):
            if command.applied_step is not None and command.applied_step > to_step and command.kind != GUARD \
                    and not command.superseded:
                self.commands[index] = dataclasses.replace(command, superseded=True)

    def result(self, command_id: int, rank: int, ok: bool, value: Any) -> None:
        with self._changed:
            self._results.setdefault(command_id, {})[rank] = (ok, value)
            command = self.commands[command_id - 1]
            if command.applied_step is None and rank == 0:
                self.commands[command_id - 1] = dataclasses.replace(command, applied=time.time())
            self._changed.notify_all()

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
        return [{**command.as_dict(), "description": command.describe()} for command in self.all()
                if command.kind not in NOT_CHANGES and command.kind != GUARD]


def _loaded(saved: dict[str, Any]) -> Command:
    """A command as the run's state file kept it (JSON: a rewind's rank times keyed by text)."""
    times = saved.get("rank_times")
    return Command(**{**saved, "rank_times": {int(rank): when for rank, when in times.items()} if times else None})


def _asked_ranks(kind: str, asked: list[int] | None, live: list[int]) -> list[int]:
    """The ranks a ``stacks`` or ``profile`` command is for (None: every rank running), each one running."""
    what = "stacks" if kind == STACKS else "a profile"
    if not live:
        raise ValueError(f"no rank is running now, to take {what} of (it may be starting or restarting; ask "
                         "again once its ranks run).")
    if asked is None:
        return live
    missing = [rank for rank in asked if rank not in live]
    if missing:
        raise ValueError(f"rank(s) {missing} are not running; its running ranks are {live}.")
    return sorted(set(asked))


def _step_ahead(running: dict[int, SteeringBeat]) -> int:
    if not running:
        return AS_SOON_AS_BACK
    held = {said.paused_at for said in running.values()}
    if len(held) == 1 and (step := held.pop()) is not None:  # every rank holds at one step: it is due there
        return step
    furthest = max(said.step for said in running.values())
    rate = max(said.rate or 0.0 for said in running.values())
    return furthest + max(MIN_LEAD_STEPS, math.ceil(rate * LEAD_S))
