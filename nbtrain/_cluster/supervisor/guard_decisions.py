"""What the run's supervisor does when a rank's guard trips (see :mod:`nbtrain._guards`).

Every rank that sees the trouble says so, and may say it late (its call races the rewind it caused),
so one decision is made per branch: a trip from a branch a rewind already left, or while the guard's
last action is still on its way to the ranks, is dropped. The action is an ordinary command of the
run's steering (a rewind or a pause, the same step on every rank), or the run's stop; each is an event.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from nbtrain._cluster.commands import PAUSE, REWIND, Command, SteeringBeat


class RunSteering(Protocol):
    """What the guards' decisions use of the run's steering
    (:class:`nbtrain._cluster.supervisor.run_steering.RunSteering`, which holds these decisions: named here by
    what they ask of it, so neither module imports the other)."""

    commands: list[Command]

    def guard(self) -> dict[str, Any]: ...

    def rewinds(self) -> list[Command]: ...

    def paused(self) -> bool: ...

    def issue(self, kind: str, args: dict[str, Any], running: dict[int, SteeringBeat], live: bool) -> Command: ...

    def record(self, kind: str, message: str, **fields: Any) -> None: ...


GUARD_WHY = "guard"  # a rewind's ``why`` starts so when a guard asked for it: those count against max_rewinds


class GuardDecisions:
    """One run's answers to its guards' trips."""

    def __init__(self, steering: RunSteering) -> None:
        self.steering = steering
        self._lock = threading.Lock()
        self._busy: int | None = None   # the id of the guard's last command, until rank 0 applied it
        self._stopping = False

    def tripped(self, attempt: int, branch: int, step: int, kind: str, message: str,
                running: dict[int, SteeringBeat], live: bool) -> bool:
        """A rank's trip (``branch``: the rewinds it applied this attempt); True when the run must stop."""
        steering = self.steering
        guard = steering.guard()
        with self._lock:
            if not guard or self._stopping or self._waiting() or branch < self._branch(attempt):
                return False
            action = guard["nan"] if kind == "nan" else guard["spike_action"]
            why = ""
            if action == "rewind":
                spent = sum(1 for c in steering.rewinds() if str(c.args.get("why", "")).startswith(GUARD_WHY))
                if spent >= guard["max_rewinds"]:
                    action, why = "pause", (f"; its {guard['max_rewinds']} rewinds (max_rewinds) are spent, so the "
                                            "run is paused: look at it, then run.rewind(...) and run.resume()")
            if action == "rewind":
                try:
                    command = steering.issue(REWIND, {"step": step - 1, "skip": guard["skip_batches"], "through": step,
                                                      "lr_factor": guard["lr_factor"], "attempt": attempt,
                                                      "why": f"{GUARD_WHY}: {kind} at step {step}"}, running, live)
                except ValueError as refused:
                    action, why = "pause", f"; it cannot rewind ({refused}), so the run is paused"
            steering.record("guard", f"guard tripped, {message}: {action}{why}", tripped=kind, step=step,
                            action=action)
            if action == "stop":
                self._stopping = True
                return True
            if action == "pause":
                if steering.paused():
                    return False
                command = steering.issue(PAUSE, {}, running, live)
            self._busy = command.id
            return False

    def _waiting(self) -> bool:
        if self._busy is None:
            return False
        return self.steering.commands[self._busy - 1].applied_step is None

    def _branch(self, attempt: int) -> int:
        """Rewinds applied in ``attempt``: a rank's trip from before the last of them is stale."""
        return sum(1 for c in self.steering.rewinds()
                   if c.args.get("attempt") == attempt and c.applied_step is not None)

