"""The supervisor's side of steering a live run: it numbers the notebook's commands, picks their step,
keeps them in the run's history, and hands them to the ranks (see :mod:`nbtrain._cluster.commands`).

The step: every rank must apply a change at the same step, so the supervisor picks one a little ahead
of the furthest rank — far enough that the command reaches each rank (each holds a standing question, answered at once)
before it gets there: :data:`LEAD_S` of steps at the run's current rate, and at least
:data:`MIN_LEAD_STEPS`. Every rank says at which step it applied it; if they disagree (a rank was held
up longer than the lead), the run's events say so. The ranks measure their rate of steps themselves,
on each heartbeat, so the lead is right from the first seconds of a run. A command issued while no rank runs (a restart)
is applied at the next attempt's first step; the changes made so far are re-applied by every new
attempt (from its payload) at the steps they were applied at, so a restarted run follows the same
settings as the first.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.commands import (
    ADJUST,
    ADJUSTABLE,
    AS_SOON_AS_BACK,
    NOT_CHANGES,
    PAUSE,
    PROFILE,
    RESUME,
    STACKS,
    STOP_AFTER_EPOCH,
    Command,
    describe,
)

LEAD_S = 0.5          # how far ahead of the furthest rank a command's step is, in time at the current rate
MIN_LEAD_STEPS = 3


class RunSteering:
    """The commands of one run; thread-safe (pushes, polls and the notebook's calls come on many threads)."""

    def __init__(self, record: Callable[[str, str], None], persist: Callable[[], None],
                 saved: list[dict[str, Any]] | None = None) -> None:
        self.record = record       # (kind, message): an event in the run's history
        self._persist = persist    # the run's state, commands included, to its storage
        self.commands: list[Command] = [Command(**saved_command) for saved_command in saved or []]
        self._applied_by: dict[int, dict[int, int]] = {}       # command id -> rank -> step
        self._results: dict[int, dict[int, tuple[bool, Any]]] = {}
        self._changed = threading.Condition()

    def start_with(self, settings: dict[str, Any]) -> None:
        """A new run's first command: these optimizer settings before the first update (a fork's config)."""
        with self._changed:
            self.commands.append(Command(id=len(self.commands) + 1, kind=ADJUST, args={**settings, "group": None},
                                         at_step=0, issued=time.time()))

    # ------------------------------------------------------------------ the notebook asks
    def issue(self, kind: str, args: dict[str, Any], ranks: list[dict[str, Any]], live: bool) -> dict[str, Any]:
        """A new command, with the step it takes effect at; ``ranks``: the worker table's rows."""
        if kind == ADJUST:
            self._check_adjust(args, ranks, live)
        running = [row for row in ranks if row.get("state") in ("running", "paused", "stalled")]
        if kind in (STACKS, PROFILE):
            args = {**args, "ranks": _asked_ranks(kind, args.get("ranks"), running)}
        if kind == PAUSE and self._paused():
            raise ValueError("the run is paused already (or about to be); resume it first.")
        if kind == RESUME and not self._paused():
            raise ValueError("the run is not paused; nothing to resume.")
        if kind == STOP_AFTER_EPOCH:
            if running and not any(row.get("epochs_counted") for row in running):
                raise ValueError("its ranks count no epochs: stop(after='epoch') needs a loader from "
                                 "nbtrain.prepare_loader (or Lightning's / Hugging Face's trainer through "
                                 "nbtrain); stop() it, or checkpoint_now() first.")
            epochs = [row.get("epoch") or 0 for row in running]
            args = {**args, "epoch": max(epochs, default=0)}
        with self._changed:
            command = Command(id=len(self.commands) + 1, kind=kind, args=args, at_step=_step_ahead(running),
                              issued=time.time())
            self.commands.append(command)
            self._changed.notify_all()
        self._persist()
        return command.as_dict()

    def _check_adjust(self, args: dict[str, Any], ranks: list[dict[str, Any]], live: bool) -> None:
        settings = {key: value for key, value in args.items() if key != "group"}
        if not settings:
            raise ValueError(f"adjust() needs a setting to change: {', '.join(ADJUSTABLE)}.")
        known = next((row["hyper"] for row in sorted(ranks, key=lambda r: r["rank"]) if row.get("hyper")), None)
        if known is None:
            if live and any(row.get("state") == "running" for row in ranks):
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

    def _paused(self) -> bool:
        """Whether the last pause was not resumed (it may not have been reached yet: the ranks' word lags)."""
        last = next((command.kind for command in reversed(self.commands) if command.kind in (PAUSE, RESUME)), None)
        return last == PAUSE

    def stop_after_epoch(self) -> int | None:
        """The epoch ``run.stop(after="epoch")`` named, if it was asked."""
        return next((int(command.args["epoch"]) for command in reversed(self.commands)
                     if command.kind == STOP_AFTER_EPOCH), None)

    # ------------------------------------------------------------------ the ranks ask and answer
    def since(self, seen: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """The commands after the ``seen``-th, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while len(self.commands) <= seen and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return [command.as_dict() for command in self.commands[seen:]]

    def all(self) -> list[dict[str, Any]]:
        return self.since(0)

    def applied(self, command_id: int, rank: int, step: int, before: dict[str, Any] | None, when: float,
                world_size: int) -> None:
        with self._changed:
            command = self.commands[command_id - 1]
            steps = self._applied_by.setdefault(command_id, {})
            steps[rank] = step
            if rank == 0 and command.applied_step is None:
                command.applied_step, command.applied, command.before = step, when, before
                message = describe(command.as_dict())
            else:
                message = ""
            disagree = len(steps) == world_size and len(set(steps.values())) > 1
            self._changed.notify_all()
        if message:
            self._persist()
            self.record("change", message)
        if disagree:
            where = ", ".join(f"rank {r} at step {s}" for r, s in sorted(steps.items()))
            self.record("change", f"command {command_id} was applied at different steps ({where}): a rank was "
                                   "held up longer than the lead; the replicas may differ from here on.")

    def result(self, command_id: int, rank: int, ok: bool, value: Any) -> None:
        with self._changed:
            self._results.setdefault(command_id, {})[rank] = (ok, value)
            command = self.commands[command_id - 1]
            if command.applied_step is None and rank == 0:
                command.applied = time.time()
            self._changed.notify_all()

    def results(self, command_id: int, ranks: list[int], wait_s: float) -> dict[int, tuple[bool, Any]]:
        """The answers of a user command's ranks so far, waiting up to ``wait_s`` for those of ``ranks``."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while not set(ranks) <= set(self._results.get(command_id, {})) \
                    and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return dict(self._results.get(command_id, {}))

    def when_applied(self, command_id: int, wait_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + wait_s
        with self._changed:
            command = self.commands[command_id - 1]
            while command.applied is None and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return command.as_dict()

    def changes(self) -> list[dict[str, Any]]:
        """The commands applied (or waiting), for ``run.changes`` and the curves' markers."""
        return [{**command, "description": describe(command)} for command in self.all()
                if command["kind"] not in NOT_CHANGES]


def _asked_ranks(kind: str, asked: list[int] | None, running: list[dict[str, Any]]) -> list[int]:
    """The ranks a ``stacks`` or ``profile`` command is for (None: every rank running), each one running."""
    live = sorted(int(row["rank"]) for row in running)
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


def _step_ahead(running: list[dict[str, Any]]) -> int:
    if not running:
        return AS_SOON_AS_BACK
    paused = {int(row["paused_at"]) for row in running if row.get("paused_at") is not None}
    if len(paused) == 1 and all(row.get("paused_at") is not None for row in running):  # held at one step
        return paused.pop()  # every rank holds there: the command is due there
    furthest = max(int(row.get("steer_step") or 0) for row in running)
    rate = max(float(row.get("steer_rate") or row.get("steps_per_s") or 0.0) for row in running)
    return furthest + max(MIN_LEAD_STEPS, math.ceil(rate * LEAD_S))
