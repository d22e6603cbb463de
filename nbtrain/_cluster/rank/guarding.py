"""A rank's guards (``run.guard``, ``launch(guard=...)``): checked on the rank, at each report and update.

The settings are :mod:`nbtrain._guards`'. A trip is told to the run's supervisor (one call, not
waited for), which issues the guard's action as a command every rank applies at the same step; the
rank goes on meanwhile. Non-finite gradients are caught in the optimizer's step pre-hook, where DDP
has made them the same on every rank: that update is skipped on every rank alike (its gradients
dropped), so the replicas stay finite and identical until the rewind. A rank trips once per branch:
a rewind (or a resume) arms it again.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable
from typing import Any

from nbtrain._guards import SPIKE_WARMUP, SPIKE_WINDOW


class RankGuard:
    """One rank's guard: ``trip(step, kind, message)`` is called once per branch when it sees trouble."""

    def __init__(self, settings: dict[str, Any], trip: Callable[[int, str, str], None]) -> None:
        self.settings = settings
        self.metric: str = settings["metric"]
        self.nan = settings["nan"] is not None
        self.spike: float | None = settings["spike"]
        self._trip = trip
        self._recent: collections.deque[float] = collections.deque(maxlen=SPIKE_WINDOW)
        self.tripped = False

    def rearm(self, forget: bool = False) -> None:
        """Check again (after a rewind: ``forget`` the values seen on the branch left)."""
        self.tripped = False
        if forget:
            self._recent.clear()

    def saw_report(self, metrics: dict[str, Any], step: int) -> None:
        """``report()``'s metrics at ``step``: the guarded metric checked against NaN and its running median."""
        value = metrics.get(self.metric)
        if value is None or self.tripped:
            return
        try:
            number = float(value)
        except (TypeError, ValueError):
            return
        if not math.isfinite(number):
            if self.nan:
                self._tripped(step, "nan", f"its {self.metric} was {number} at step {step}")
            return
        if self.spike is not None and len(self._recent) >= SPIKE_WARMUP:
            median = statistics.median(self._recent)
            if median > 0 and number > self.spike * median:
                self._tripped(step, "spike", f"its {self.metric} was {number:.4g} at step {step}, above "
                                             f"{self.spike:g}x its running median {median:.4g}")
                return
        self._recent.append(number)

    def gradients_finite(self, optimizer: Any, step: int) -> bool:
        """Before an update: False (the update is to be skipped) when a gradient is NaN or infinite."""
        if not self.nan:
            return True
        import torch

        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads or bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)).item()):
            return True
        if not self.tripped:
            self._tripped(step, "nan", f"its gradients were not finite at step {step} (that update was skipped)")
        return False

    def _tripped(self, step: int, kind: str, message: str) -> None:
        self.tripped = True
        self._trip(step, kind, message)
