"""What the notebook can tell a live run's ranks, declared once for the notebook, the supervisor and the ranks.

A command is issued by the notebook (``run.adjust(lr=0.01)``, a click on the dashboard), numbered
and given the step at which it takes effect by the run's supervisor, and applied by every rank at
that step, so that DDP replicas stay identical. What each kind checks, where it lands and how it is
applied and described is its own module in :mod:`nbtrain._cluster.command_kinds`, looked up in one
table; :mod:`nbtrain._cluster.supervisor.run_steering` (the supervisor's side) and
:mod:`nbtrain._cluster.rank.rank_steering` (the ranks') do what a kind says.

Everything that travels is a dataclass of this module: the :class:`Command` (notebook ← supervisor →
ranks) and the rank's :class:`Heartbeat` with its :class:`SteeringBeat` (ranks → supervisor). Each
setting a live run can change is one :class:`Setting` in :data:`SETTINGS`: the notebook checks a value
there once (:func:`checked_settings`, one message per setting) and the ranks apply what it returns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from nbtrain._exceptions import InvalidOptionError

ADJUST, PAUSE, RESUME, CHECKPOINT, STOP_AFTER_EPOCH, USER, STACKS, PROFILE, REWIND, GUARD, EXEC, PATCH, STOP = (
    "adjust", "pause", "resume", "checkpoint", "stop_after_epoch", "user", "stacks", "profile", "rewind", "guard",
    "exec", "patch", "stop")
MAX_PROFILE_STEPS = 1000

AS_SOON_AS_BACK = -1  # at_step of a command issued while no rank runs: the next attempt's first step
AGREE_WAIT_S = 5.0    # a rank asking for a command's step waits this long for every rank to say it learnt it
DECLINED = -2         # the first step a rank says it can apply a command at, when it never will (see run_steering)


# ---------------------------------------------------------------------- the settings a live run can change
def _finite(value: Any, good: Callable[[float], bool]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not good(value):
        raise ValueError
    return float(value)


def _at_least_zero(value: Any) -> float:
    return _finite(value, lambda v: v >= 0)


def _pair_below_one(value: Any) -> list[float]:
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ValueError
    return [_finite(beta, lambda v: 0 <= v < 1) for beta in value]


def _positive_or_off(value: Any) -> float | None:
    return None if value is None else _finite(value, lambda v: v > 0)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One optimizer setting a live run can change: how a value is checked, and the range its error names."""

    name: str
    checked: Callable[[Any], Any]   # the value as the ranks apply it; ValueError when out of range
    expected: str                   # what a good value is, for the error
    in_param_groups: bool = True    # torch's param groups hold it (grad_clip is nbtrain's own)


# The optimizer settings a live run can change, as torch's param groups name them; ``grad_clip`` is
# nbtrain's own (the max norm it clips gradients to before each update; None: no clipping).
SETTINGS = {setting.name: setting for setting in (
    Setting("lr", _at_least_zero, "a finite number >= 0"),
    Setting("weight_decay", _at_least_zero, "a finite number >= 0"),
    Setting("momentum", _at_least_zero, "a finite number >= 0"),
    Setting("betas", _pair_below_one, "a pair like (0.9, 0.999), each in [0, 1)"),
    Setting("grad_clip", _positive_or_off, "a finite number > 0, or None to stop clipping", in_param_groups=False),
)}
ADJUSTABLE = tuple(SETTINGS)
IN_PARAM_GROUPS = tuple(name for name, setting in SETTINGS.items() if setting.in_param_groups)
NO_SETTING_GIVEN = f"adjust() needs a setting to change: {', '.join(ADJUSTABLE)}."


def checked_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Optimizer settings (keys of ``SETTINGS``) as the ranks apply them, or the error naming the bad one.

    ``where`` names the value in the message, with ``{name}`` for the setting: ``"adjust({name}=...)"``.
    """
    settings: dict[str, Any] = {}
    for key, value in values.items():
        setting = SETTINGS[key]
        try:
            settings[key] = setting.checked(value)
        except ValueError:
            raise InvalidOptionError(f"{where.format(name=key)} must be {setting.expected}, got {value!r}.") from None
    return settings


# ---------------------------------------------------------------------- notebook -> supervisor -> ranks
@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a run, in the order issued (``id`` from 1), as the supervisor hands it to the notebook
    and to the ranks. Its ``args`` are the kind's own (read them through the properties below); the saved
    run and ``run.changes`` keep it as a plain dict (:meth:`as_dict`)."""

    id: int
    kind: str
    args: dict[str, Any]
    at_step: int                      # the step before whose optimizer update every rank applies it
    issued: float                     # time.time() at the supervisor
    applied_step: int | None = None   # the step at which rank 0 applied it, once it did
    applied: float | None = None      # when (rank 0's clock)
    before: dict[str, Any] | None = None  # ADJUST: rank 0's values just before (per param group lists);
    #                                       STOP_AFTER_EPOCH: {"epoch": the epoch the ranks end with}
    superseded: bool = False          # applied on a branch a later rewind went back from: not re-applied
    rank_times: dict[int, float] | None = None  # REWIND: when each rank applied it (its own clock)
    dropped: str | None = None        # REWIND: why it never applied (the run restarted before its ranks got there)
    definition: bytes | None = None   # a kind not nbtrain's own, pickled by value (command_kinds.table.register)

    @property
    def settings(self) -> dict[str, Any]:
        """ADJUST: the settings it changes (keys of :data:`SETTINGS`)."""
        return {key: value for key, value in self.args.items() if key != "group"}

    @property
    def group(self) -> int | None:
        """ADJUST: the one param group it changes; None: every group."""
        return self.args.get("group")

    @property
    def ranks(self) -> list[int]:
        """STACKS, PROFILE: the ranks asked."""
        return list(self.args["ranks"])

    @property
    def epoch(self) -> int:
        """STOP_AFTER_EPOCH: the epoch after which the run stops: the one the ranks are in at the command's step
        once they applied it, the furthest the supervisor knew of before."""
        return int((self.before or self.args)["epoch"])

    @property
    def steps(self) -> int:
        """PROFILE: how many steps to profile."""
        return int(self.args["steps"])

    @property
    def handler(self) -> tuple[str, dict[str, Any]]:
        """USER: the ``@on_command`` handler's name and the keyword arguments sent to it."""
        return self.args["name"], dict(self.args.get("payload") or {})

    @property
    def rewind(self) -> tuple[int, int]:
        """REWIND: the restore point's step it goes back to, and the batches skipped after it."""
        return int(self.args["to_step"]), int(self.args.get("skip", 0))

    def due_at(self, step: int) -> Command:
        return dataclasses.replace(self, at_step=step)

    def as_dict(self) -> dict[str, Any]:
        """The command as the run's saved state keeps it (a kind's definition is not kept)."""
        saved = dataclasses.asdict(self)
        del saved["definition"]
        return saved


# ---------------------------------------------------------------------- ranks -> supervisor
@dataclasses.dataclass(frozen=True)
class SteeringBeat:
    """What a rank's heartbeat says for steering: where it is, how fast it goes, the settings it has now."""

    step: int                     # the step being taken (where a command's step is counted)
    rate: float | None            # steps per second, measured by the rank from beat to beat
    epoch: int
    settings: dict[str, list[Any]] | None = None  # SETTINGS now, per param group; None: no optimizer given
    paused_at: int | None = None          # the step it is held at by a pause
    held_after_epoch: int | None = None   # it finished this epoch and waits for the run's stop
    epochs_counted: bool = False          # a prepared loader or an integration counts its epochs
    restore_points: tuple[int, ...] = ()  # the steps it can rewind to in place (see rank/rewinding)
    rewind_refusal: str | None = None     # why it cannot rewind itself, if it cannot


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """A rank's word on itself, with every push of its rows (see :mod:`nbtrain._cluster.relay.push_relay`)."""

    time: float                   # time.time() at the rank
    step: int                     # the last step it reported
    state: str                    # "running", or "paused" while a pause holds it
    last_progress: float          # when it last made progress (a stall is none for too long)
    steering: SteeringBeat
    samples_per_s: float | None = None   # measured about once a second
    measured: dict[str, float] = dataclasses.field(default_factory=dict)  # step timing, memory (rss_mb, ...)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # the launch's phases it ended (launch_phases)


def where_rank_is(rank: int, answer: tuple[bool, Any] | None, wait_s: float) -> str:
    """One rank's answer to a ``stacks`` command in one line, for the stall's event and the notebook."""
    if answer is None:
        return (f"rank {rank} did not answer within {wait_s:g} s (its process is gone, or stuck in C code that "
                "holds Python's GIL)")
    ok, value = answer
    if not ok:
        return f"rank {rank}: {value}"
    return f"rank {rank} {value['verdict']}"

