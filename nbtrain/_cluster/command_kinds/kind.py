"""What a kind of command is: its check in the notebook, its step at the supervisor, its hook point and its
application on the ranks, and its line in the run's history — one class, one module per kind.

The notebook (:mod:`nbtrain._client.run.reader`), the supervisor (:mod:`nbtrain._cluster.supervisor.run_steering`) and
each rank (:mod:`nbtrain._cluster.rank.rank_steering`) look a command's kind up in the table
(:mod:`.table`) and ask it; none of them branches on a kind's name. A kind reaches the rank's and the
supervisor's state only through the two protocols below, so this folder imports neither process's code.
"""

from __future__ import annotations

import math
import threading
from typing import Any, ClassVar, Protocol

from nbtrain._cluster.commands import AS_SOON_AS_BACK, Command, SteeringBeat

LEAD_S = 0.5          # how far ahead of the furthest rank a command's step is, in time at the current rate
MIN_LEAD_STEPS = 3

# Where on a rank a kind is applied (its hook point):
ON_LEARNING = "on learning"      # on the rank's listener thread, the moment it learns it (not bound to a step)
BEFORE_UPDATE = "before update"  # torch's optimizer step pre-hook at its step (or a report(), without optimizer)
AFTER_UPDATE = "after update"    # the step post-hook, once the model is consistent again


class SupervisorSide(Protocol):
    """What a kind uses of the run's steering on the supervisor (:class:`~nbtrain._cluster.supervisor.run_steering.
    RunSteering`)."""

    commands: list[Command]

    def paused(self) -> bool: ...

    def record(self, kind: str, message: str, **fields: Any) -> None: ...

    def answered(self, command_id: int) -> set[int]: ...


class RankSide(Protocol):
    """What a kind uses of a rank's steering (:class:`~nbtrain._cluster.rank.rank_steering.RankSteering`): its
    state, and the primitives that need the rank's own modules (torch, the guard, the restore points)."""

    session: Any
    grad_clip: float | None
    checkpoint_wanted: bool
    stop_after_epoch: int | None
    resumed: threading.Event

    def values(self) -> dict[str, list[Any]]: ...

    def adjust(self, settings: dict[str, Any], group_index: int | None) -> None: ...

    def rewind(self, command: Command) -> None: ...

    def profile(self, command: Command, step: int) -> None: ...

    def run_handler(self, command: Command) -> None: ...

    def ask_stacks(self, command: Command) -> None: ...

    def set_guard(self, guard: dict[str, Any]) -> None: ...

    def rearm_guard(self) -> None: ...

    def hold(self, step: int) -> None: ...

    def has_step_boundary(self) -> bool: ...

    def replayed(self, command: Command) -> bool: ...

    def answer(self, command: Command, ok: bool, value: Any) -> None: ...

    def run_code(self, command: Command) -> None: ...

    def patch_code(self, command: Command, step: int) -> None: ...

    def end_function(self, step: int) -> None: ...


class Issuing:
    """A command being issued at the supervisor: the run's steering, what each running rank last said, whether
    the run is running, and its attempt."""

    def __init__(self, steering: SupervisorSide, running: dict[int, SteeringBeat], live: bool,
                 attempt: int | None) -> None:
        self.steering = steering
        self.running = running
        self.live = live
        self.attempt = attempt


class CommandKind:
    """One kind of command. The class attributes say how the three processes treat it; the methods are its
    behaviour, each with the default most kinds share."""

    name: ClassVar[str]
    hook: ClassVar[str] = BEFORE_UPDATE
    needs_optimizer: ClassVar[bool] = False   # not applied at a report() of a loop that gives nbtrain none
    between_batches: ClassVar[bool] = False   # with a prepared loader: applied as the next step's batch is taken
    asks_ranks: ClassVar[bool] = False        # for the ranks in args["ranks"], answered once (not by a new attempt)
    is_change: ClassVar[bool] = True          # one of the run's changes (run.changes, the curves' marks)
    replayed: ClassVar[str] = ""              # a new attempt applies again: "each" one not superseded, the "last"
    says_applied: ClassVar[bool] = True       # every rank tells the supervisor the step it applied it at
    event: ClassVar[str] = "change"           # the kind of the run's event that says it applied
    goes_back: ClassVar[bool] = False         # rows past its step belong to a branch it leaves (a rewind)
    bound_to_step: ClassVar[bool] = True      # described with the step it lands on
    survives_rewind: ClassVar[bool] = False   # a rewind's branch does not take it back (a guard, a patch)
    held_by_optimizer_state: ClassVar[bool] = False  # a checkpoint's optimizer state holds it once applied
    dropped_when_refused: ClassVar[bool] = False     # rank 0's refusal (its answer) means it never applies
    marked: ClassVar[bool] = False            # a mark on the curves at the step it applied at
    holds_the_run: ClassVar[bool] = False     # it pauses the run: a pause seen before rank 0 said so is its own

    # ------------------------------------------------------------------ the notebook
    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        """The args as sent, or :class:`~nbtrain.InvalidOptionError` naming the bad one (nothing is sent)."""
        return args

    # ------------------------------------------------------------------ the supervisor
    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        """The args the command keeps, completed from the run's state; ``ValueError`` says why it is refused."""
        return args

    def step(self, running: dict[int, SteeringBeat], paused: bool) -> int:
        """The step proposed for every rank to apply it at: a little ahead of the furthest rank (:func:`step_ahead`);
        the ranks agree on it with the supervisor as they reach it (:meth:`~nbtrain._cluster.supervisor.run_steering.
        RunSteering.step_for`)."""
        return step_ahead(running, paused)

    def on_issued(self, steering: SupervisorSide, command: Command) -> None:
        """Once numbered and kept (e.g. an event for a kind in force at once)."""

    # ------------------------------------------------------------------ the ranks
    def learnt(self, rank: RankSide, command: Command, pending: list[Command]) -> bool:
        """The rank learns it (``pending``: what it has still to apply, which a kind may call off); True adds it
        there, for its hook point at its step."""
        return True

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        """Apply it at ``step``; returns what the history keeps as its ``before`` (None: nothing)."""
        raise NotImplementedError(f"the command kind {self.name!r} applies at no step")

    def after_said(self, rank: RankSide, command: Command, step: int) -> None:
        """After the rank told the supervisor it applied it (a pause holds here)."""

    # ------------------------------------------------------------------ the history
    def describe(self, command: Command, where: str) -> str:
        """The change as the curves' marker and the events say it; ``where``: `` at step 1200`` (or empty)."""
        return f"{self.name}{where}"


def step_ahead(running: dict[int, SteeringBeat], paused: bool) -> int:
    """The step proposed for a command: where every rank is held, if the run is ``paused`` and they all said they are
    held at one; else :data:`LEAD_S` of steps at the run's rate (at least :data:`MIN_LEAD_STEPS`) past the furthest
    rank, so the command usually reaches each rank first; :data:`AS_SOON_AS_BACK` while no rank runs."""
    if not running:
        return AS_SOON_AS_BACK
    held = {said.paused_at for said in running.values()}
    if paused and len(held) == 1 and (step := held.pop()) is not None:  # a resume asked: they may be past it
        return step
    furthest = max(said.step for said in running.values())
    rate = max(said.rate or 0.0 for said in running.values())
    return furthest + max(MIN_LEAD_STEPS, math.ceil(rate * LEAD_S))


def short(value: Any) -> str:
    """A value as a description shows it: floats to 4 significant digits, pairs in parentheses."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(short(item) for item in value) + ")"
    return repr(value) if isinstance(value, str) else str(value)

