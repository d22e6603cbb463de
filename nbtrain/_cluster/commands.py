"""What the notebook can tell a live run's ranks, declared once for the notebook, the supervisor and the ranks.

A command is issued by the notebook (``run.adjust(lr=0.01)``, a click on the dashboard), numbered
and given the step at which it takes effect by the run's supervisor, and applied by every rank at
that step — before that step's optimizer update, so that DDP replicas stay identical. Two kinds
look rather than change: ``stacks`` is answered by each rank the moment it learns it (not at a step:
a stuck rank takes none), and ``profile`` runs torch.profiler on the chosen ranks for a number of
steps; neither is one of the run's changes (``run.changes``), and a new attempt does neither again. See
:mod:`nbtrain._cluster.run.steering` (the supervisor's side) and :mod:`nbtrain._cluster.rank.steering`
(the ranks').
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from nbtrain._exceptions import InvalidOptionError

# The optimizer settings a live run can change, as torch's param groups name them; ``grad_clip`` is
# nbtrain's own (the max norm it clips gradients to before each update; None: no clipping).
ADJUSTABLE = ("lr", "weight_decay", "momentum", "betas", "grad_clip")

ADJUST, PAUSE, RESUME, CHECKPOINT, STOP_AFTER_EPOCH, USER, STACKS, PROFILE = (
    "adjust", "pause", "resume", "checkpoint", "stop_after_epoch", "user", "stacks", "profile")
KINDS = (ADJUST, PAUSE, RESUME, CHECKPOINT, STOP_AFTER_EPOCH, USER, STACKS, PROFILE)
NOT_CHANGES = (USER, STACKS, PROFILE)  # answered to the notebook; not in run.changes, not re-applied
MAX_PROFILE_STEPS = 1000

AS_SOON_AS_BACK = -1  # at_step of a command issued while no rank runs: the next attempt's first step


@dataclasses.dataclass
class Command:
    """One command of a run, in the order issued (``id`` from 1)."""

    id: int
    kind: str
    args: dict[str, Any]
    at_step: int                      # the step before whose optimizer update every rank applies it
    issued: float                     # time.time() at the supervisor
    applied_step: int | None = None   # the step at which rank 0 applied it, once it did
    applied: float | None = None      # when (rank 0's clock)
    before: dict[str, Any] | None = None  # ADJUST: rank 0's values just before (per param group lists)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe(command: dict[str, Any]) -> str:
    """The change as the curves' marker and the events say it: ``lr 0.1 → 0.01 at step 1200``."""
    args = command["args"]
    step = command["applied_step"] if command.get("applied_step") is not None else command["at_step"]
    where = f" at step {step}" if step >= 0 else " as the ranks come back"
    if command["kind"] in (RESUME, STOP_AFTER_EPOCH):  # not bound to a step: a resume acts at once
        where = ""
    if command["kind"] == ADJUST:
        before = command.get("before") or {}
        parts = []
        for key, value in args.items():
            if key == "group":
                continue
            old = before.get(key)
            shown_old = _short(old[0] if isinstance(old, list) and len(set(map(repr, old))) == 1 else old)
            parts.append(f"{key} {shown_old} → {_short(value)}" if old is not None else f"{key} → {_short(value)}")
        group = f" (param group {args['group']})" if args.get("group") is not None else ""
        return ", ".join(parts) + group + where
    if command["kind"] == USER:
        return f"command {args['name']!r}" + where
    if command["kind"] == STACKS:
        return "stacks asked"
    if command["kind"] == PROFILE:
        return f"profile of {args['steps']} steps on rank(s) {args['ranks']}" + where
    return {PAUSE: "paused", RESUME: "resumed", CHECKPOINT: "checkpoint asked",
            STOP_AFTER_EPOCH: f"stop after epoch {args.get('epoch')}"}[command["kind"]] + where


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_short(item) for item in value) + ")"
    return repr(value) if isinstance(value, str) else str(value)


def where_rank_is(rank: int, answer: tuple[bool, Any] | None, wait_s: float) -> str:
    """One rank's answer to a ``stacks`` command in one line, for the stall's event and the notebook."""
    if answer is None:
        return (f"rank {rank} did not answer within {wait_s:g} s (its process is gone, or stuck in C code that "
                "holds Python's GIL)")
    ok, value = answer
    if not ok:
        return f"rank {rank}: {value}"
    return f"rank {rank} {value['verdict']}"


def checked_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Optimizer settings (keys of ``ADJUSTABLE``) as the ranks apply them, or the error naming the bad one.

    ``where`` names the value in the message, with ``{name}`` for the setting: ``"adjust({name}=...)"``.
    """
    settings: dict[str, Any] = {}
    for key, value in values.items():
        if key == "betas":
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise InvalidOptionError(f"{where.format(name=key)} must be a pair like (0.9, 0.999), got {value!r}.")
            settings[key] = [_number(where.format(name=key), b, lambda v: 0 <= v < 1) for b in value]
        elif key == "grad_clip":
            settings[key] = None if value is None else _number(where.format(name=key), value, lambda v: v > 0)
        else:
            settings[key] = _number(where.format(name=key), value, lambda v: v >= 0)
    return settings


def _number(what: str, value: Any, good: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not good(value):
        raise InvalidOptionError(f"{what} must be a finite number in range, got {value!r}.")
    return float(value)
