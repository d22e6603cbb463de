"""A run's guards against divergence, declared once for the notebook (``run.guard``, ``launch(guard=)``,
``--guard``), the supervisor and the ranks.

A guard is evaluated on every rank, with no round trip to the notebook (see
:mod:`nbtrain._cluster.rank.guarding`): a non-finite loss or gradient (``nan``), or a loss above
``spike`` times its running median, asks the run's supervisor for its ``action``, which it issues as
a command applied at the same step on every rank: ``rewind`` (to the last restore point before the
step that tripped, skipping the batches up to and through it, the learning rate scaled by
``lr_factor``), ``pause`` or ``stop``. Each trip and each action is an event. Once ``max_rewinds``
rewinds were made by the guards, a trip pauses the run instead and says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from nbtrain._exceptions import InvalidOptionError
from nbtrain._registry import is_whole

ACTIONS = ("rewind", "pause", "stop")
DEFAULTS: dict[str, Any] = {"nan": None, "spike": None, "spike_action": "rewind", "lr_factor": None,
                            "skip_batches": None, "max_rewinds": 3, "metric": "loss"}
SPIKE_WINDOW = 50        # the running median is over this many of the metric's last values on the rank
SPIKE_WARMUP = 10        # and is not trusted before this many
_EXPECTED = {
    "nan": f"one of {', '.join(map(repr, ACTIONS))}, or None (no check)",
    "spike": "a finite number above 1 (a loss above that times its running median trips), or None",
    "spike_action": f"one of {', '.join(map(repr, ACTIONS))}",
    "lr_factor": "a finite number > 0 that the learning rate is multiplied by at a guard's rewind, or None",
    "skip_batches": "a whole number >= 0 of batches skipped after the restore point, or None (through the "
                    "batch that tripped)",
    "max_rewinds": "a whole number >= 0 (rewinds the guards may make before they pause the run)",
    "metric": "the name of a reported metric (a non-empty string)",
}


def _finite_above(value: Any, low: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > low)


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "nan": lambda v: v is None or v in ACTIONS,
    "spike": lambda v: v is None or _finite_above(v, 1.0),
    "spike_action": lambda v: v in ACTIONS,
    "lr_factor": lambda v: v is None or _finite_above(v, 0.0),
    "skip_batches": lambda v: v is None or is_whole(v),
    "max_rewinds": is_whole,
    "metric": lambda v: isinstance(v, str) and bool(v),
}


def checked_guard(values: dict[str, Any], where: str = "run.guard") -> dict[str, Any]:
    """The guard as the ranks evaluate it (every key, defaults filled in), or one error naming the bad key.

    ``where`` names the call in the message: ``run.guard``, ``launch(guard=...)``, ``--guard``.
    """
    if not isinstance(values, dict):
        raise InvalidOptionError(f"{where} must be a dict of guard settings ({', '.join(DEFAULTS)}), got {values!r}.")
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise InvalidOptionError(f"{where}: unknown guard setting {', '.join(map(repr, unknown))}; the settings are "
                                 f"{', '.join(DEFAULTS)}.")
    for key, value in values.items():
        if not _CHECKS[key](value):
            raise InvalidOptionError(f"{where}: {key} must be {_EXPECTED[key]}, got {value!r}.")
    guard = {**DEFAULTS, **values}
    if guard["nan"] is None and guard["spike"] is None:
        raise InvalidOptionError(f"{where} guards nothing: give nan='rewind' (or 'pause', 'stop') and/or spike=3.0; "
                                 "run.guard() alone turns the guards off.")
    return guard


def describe_guard(guard: dict[str, Any]) -> str:
    """The active guards in one line, for the events and the dashboard's control row."""
    if not guard:
        return "guards off"
    parts = []
    if guard.get("nan"):
        parts.append(f"non-finite {guard['metric']} or gradients → {guard['nan']}")
    if guard.get("spike"):
        parts.append(f"{guard['metric']} > {guard['spike']:g}x its running median → {guard['spike_action']}")
    extras = []
    if guard.get("lr_factor"):
        extras.append(f"lr x{guard['lr_factor']:g} at a rewind")
    if guard.get("skip_batches") is not None:
        extras.append(f"{guard['skip_batches']} batches skipped")
    extras.append(f"at most {guard['max_rewinds']} rewinds")
    return "guards: " + "; ".join(parts) + " (" + ", ".join(extras) + ")"
