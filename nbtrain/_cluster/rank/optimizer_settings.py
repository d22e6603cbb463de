"""What a change to a live run does to an optimizer: a setting set in its param groups (an LR schedule following
a new learning rate), an update skipped, its LR schedulers found. Runs on the ranks (see :mod:`.steering`)."""

from __future__ import annotations

import gc
from typing import Any


def drop_gradients(optimizer: Any) -> None:
    """The coming update does nothing: torch's optimizers skip a parameter without a gradient."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


def set_value(optimizer: Any, group: dict[str, Any], key: str, value: Any) -> None:
    """One checked setting into one param group (betas back to torch's tuple; an LR's schedule follows it)."""
    if key == "lr":
        old = group["lr"]
        group["lr"] = value
        if old:
            _rescale_schedules(optimizer, group, value / old)
    else:
        group[key] = tuple(value) if key == "betas" else value


def _rescale_schedules(optimizer: Any, group: dict[str, Any], factor: float) -> None:
    """An LR scheduler computes the next rates from its base values: scaled too, the schedule goes on from the
    new value. Schedulers keep no link from the optimizer, so they are found among its referrers (only
    when a change is applied: nothing on the step)."""
    from torch.optim.lr_scheduler import LRScheduler

    index = optimizer.param_groups.index(group)
    if "initial_lr" in group:
        group["initial_lr"] *= factor
    known = getattr(optimizer, "_nbtrain_schedulers", [])
    for scheduler in [*known, *(found for found in _schedulers_of(optimizer, LRScheduler) if found not in known)]:
        base = getattr(scheduler, "base_lrs", None)
        if isinstance(base, list) and index < len(base):
            base[index] *= factor
        last = getattr(scheduler, "_last_lr", None)
        if isinstance(last, list) and index < len(last):
            last[index] = group["lr"]


def _schedulers_of(optimizer: Any, kind: type) -> list[Any]:
    found = []
    for referrer in gc.get_referrers(optimizer):
        if isinstance(referrer, kind):
            found.append(referrer)
        elif isinstance(referrer, dict):
            found.extend(owner for owner in gc.get_referrers(referrer)
                         if isinstance(owner, kind) and getattr(owner, "__dict__", None) is referrer)
    return found


def schedulers(optimizers: list[Any]) -> list[Any]:
    """The LR schedulers of ``optimizers``: given to nbtrain (``_nbtrain_schedulers``), or found among their
    referrers."""
    from torch.optim.lr_scheduler import LRScheduler

    found: list[Any] = []
    for optimizer in optimizers:
        for scheduler in [*getattr(optimizer, "_nbtrain_schedulers", []), *_schedulers_of(optimizer, LRScheduler)]:
            if scheduler not in found:
                found.append(scheduler)
    return found
