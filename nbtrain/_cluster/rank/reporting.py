"""``nbtrain.report()`` and its hot path: one small object that takes a row and returns.

It runs on the training thread between two optimizer steps, when the CPU's caches hold the step's
tensors and not nbtrain's state, so every attribute it touches is a likely cache miss. It therefore
keeps only what a row needs, in slots (a small fixed layout, not the session's dict of ~40 entries),
and does nothing that can wait for the flusher thread (:mod:`nbtrain._cluster.rank.session`), which
takes the rows from :attr:`Reporter.rows`. Measured cold, after each training step of
``benchmarks/workload.py``'s model (median of 800 calls, alternating in one process): 15.2 µs through
the session's own method, 11.6 µs here; an empty function taking the same keywords costs 4.2 µs.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from nbtrain._exceptions import NbtrainError

NOT_IN_A_RUN = ("This nbtrain function only works inside a training function run by nbtrain.launch() or "
                "%%ray_train, on a worker. In the notebook, use the Run object instead.")
# values kept as they are; anything else is made a number (or text) in the call
PLAIN_TYPES: frozenset[type] = frozenset({int, float, str, bool, type(None)})


class Reporter:
    """The rows reported on this rank and the counts that number them; made by the session."""

    __slots__ = ("calls", "hook", "last_step", "rows", "step", "uses_loader")

    def __init__(self) -> None:
        self.rows: collections.deque[tuple[int, float, dict[str, Any]]] = collections.deque()
        self.calls = 0            # report() calls this attempt
        self.last_step = 0        # the step of the last reported row
        self.step = 0             # batches yielded by prepared loaders
        self.uses_loader = False  # a prepared loader numbers the steps (else the calls do)
        # work before a row, set only while steering has commands due or the noise scale is measured
        self.hook: Callable[[dict[str, Any]], None] | None = None

    def report(self, metrics: dict[str, Any], _plain: frozenset[type] = PLAIN_TYPES,
               _type: Callable[[Any], type] = type) -> None:
        """One row, its values as they are now (a tensor changed in place later keeps the reported value)."""
        if self.hook is not None:
            self.hook(metrics)
        step = metrics.pop("step", None)
        self.calls += 1
        if step is None:
            step = self.step if self.uses_loader else self.calls
        elif _type(step) is not int:
            step = _whole_step(step)
        self.last_step = step
        for value in metrics.values():
            if _type(value) not in _plain:
                metrics = {key: _to_number(item) for key, item in metrics.items()}
                break
        self.rows.append((step, time.time(), metrics))


current: Reporter | None = None  # the session's on this rank while a run runs (set by session.set_session)


def report(metrics: dict[str, Any] | None = None, /, **more: Any) -> None:
    """Record metrics for this rank; returns at once (the rows are sent in the background).

    Metrics come as keywords, as a dict (Ray Train's ``report({...})`` style), or both.
    Each call is one row with ``rank``, ``step``, ``attempt`` and ``time`` added.
    ``step`` defaults to the number of batches drawn from loaders made by
    :func:`prepare_loader` (or, without one, the number of ``report`` calls);
    pass ``step=`` (a whole number) to set it yourself. A metric named ``rank``,
    ``attempt`` or ``time`` cannot replace the row's own: it is kept as
    ``user_rank``, ``user_attempt`` or ``user_time`` (the rank's log says so once).
    Values may be numbers (tensors and numpy scalars become numbers), text, or
    NaN and infinities, which are kept as they are everywhere. A value is turned
    into a number here, in the call: a tensor changed in place afterwards keeps the
    reported value. On a GPU that means ``.item()``, which waits for the step's
    queued kernels (as ``loss.item()`` in your own code would); report a Python
    number, or report every few steps, where that wait matters.

    Args:
        metrics: a dict of metrics (optional).
        **more: metrics as keywords; ``step=`` sets the row's step.

    Raises:
        NbtrainError: called outside a training function (in the notebook: use the ``Run``).

    Example::

        nbtrain.report(loss=loss.item(), lr=scheduler.get_last_lr()[0])
        nbtrain.report({"loss": loss.item()}, epoch=epoch)
    """
    reporter = current  # the run's on this rank: a global of this module, found without a call
    if metrics is None and reporter is not None:
        reporter.report(more)
    else:
        _report_given(metrics, more)


def _report_given(metrics: dict[str, Any] | None, more: dict[str, Any]) -> None:
    """``report()`` given a dict (or called outside a run): checked, then the same row."""
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(f"report() takes a dict of metrics or keywords, not {type(metrics).__name__}: "
                        "write nbtrain.report(loss=0.5) or nbtrain.report({'loss': 0.5}).")
    twice = sorted(set(metrics or ()) & set(more))
    if twice:
        raise TypeError(f"report() was given {', '.join(map(repr, twice))} both in the dict and as a keyword: "
                        "pass each metric once.")
    if current is None:
        raise NbtrainError(NOT_IN_A_RUN)
    current.report(more if metrics is None else {**metrics, **more})


def _whole_step(step: Any) -> int:
    try:
        return int(step)
    except (TypeError, ValueError, OverflowError):
        msg = f"report(step=...) must be a whole number (the row's step), got {step!r}."
        raise NbtrainError(msg) from None


def _to_number(value: Any) -> Any:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # noqa: BLE001 - multi-element tensors fall through to float()
            pass
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
