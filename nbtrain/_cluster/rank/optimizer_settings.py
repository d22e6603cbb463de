"""What a change to a live run does to an optimizer: a setting set in its param groups, an update skipped, its LR
schedulers found. Runs on the ranks (see :mod:`.rank_steering`).

:func:`rescale_lr` is the one place a rank's learning rate changes, whoever changes it: an elastic run's scale
for its world size (``prepare_optimizer``), the adaptive batch's gain (``rank/data/loading``), ``adjust(lr=)``
and a rewind's ``lr_factor`` (``rank/rank_steering``). Each is a factor on the rate, and the LR schedulers' base
values follow it, so a schedule computed from its base (``LambdaLR``, ``OneCycleLR``, cosine) goes on from the
changed rate instead of dropping the change at its next step; the factors compose by multiplication."""

from __future__ import annotations

import gc
from typing import Any


def drop_gradients(optimizer: Any) -> None:
    """The coming update does nothing: torch's optimizers skip a parameter without a gradient."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


# The rates an LR scheduler keeps in a param group (OneCycleLR: its start, peak and end) and on itself
# (every scheduler's base_lrs; CyclicLR's peaks): each is scaled with the rate.
GROUP_RATES = ("initial_lr", "max_lr", "min_lr")
SCHEDULER_RATES = ("base_lrs", "max_lrs")


def set_value(optimizer: Any, group: dict[str, Any], key: str, value: Any) -> None:
    """One checked setting into one param group (betas back to torch's tuple; an LR's schedule follows it)."""
    if key == "lr" and group["lr"]:
        rescale_lr(optimizer, value / group["lr"], group)
        group["lr"] = value  # exactly the value asked for, not old * (value / old)
    elif key == "lr":
        group["lr"] = value  # from 0 no factor leads: the schedule keeps its base
    else:
        group[key] = tuple(value) if key == "betas" else value


def rescale_lr(optimizer: Any, factor: float, group: dict[str, Any] | None = None) -> None:
    """Multiply the learning rate of ``group`` (every group when None) by ``factor``, with what its LR schedulers
    compute the next rates from. Schedulers keep no link from the optimizer, so they are found among its
    referrers (only when a rate changes: nothing on the step)."""
    from torch.optim.lr_scheduler import LRScheduler

    if factor == 1.0:
        return
    groups = optimizer.param_groups if group is None else [group]
    known = getattr(optimizer, "_nbtrain_schedulers", [])
    schedulers = [*known, *(found for found in _schedulers_of(optimizer, LRScheduler) if found not in known)]
    for changed in groups:
        index = optimizer.param_groups.index(changed)
        changed["lr"] *= factor
        for key in GROUP_RATES:
            if isinstance(changed.get(key), (int, float)):
                changed[key] *= factor
        for scheduler in schedulers:
            for name in SCHEDULER_RATES:
                rates = getattr(scheduler, name, None)
                if isinstance(rates, list) and index < len(rates):
                    rates[index] *= factor
            last = getattr(scheduler, "_last_lr", None)
            if isinstance(last, list) and index < len(last):
                last[index] = changed["lr"]


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
