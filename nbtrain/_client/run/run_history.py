"""The history of one run in nbtrain's own terms: its metric rows, the branches its rewinds left, the marks its
changes, rewinds, resizes, restarts, patches and guard trips put on the curves, and its events.

Why one model: the same history used to be read several ways, each reader deciding for itself. Which rows a
rewind superseded was decided from the rewind records by ``run.metrics_frame()`` and by spotting a rank's step
going back by the dashboard (they disagreed on the steps a rewind skipped); resize marks were found by parsing
event messages; marks were built as plotly shapes and translated for the charts widget. Here each of those is
decided once, from what the run records (its summary's ``changes``, its events' structured fields, its rows),
and every reader asks: the reader (:mod:`.reader`), ``run.metrics_frame()``, ``run.rewinds``, ``run.on_row``,
the dashboard's drawing buffer and marks, ``compare()`` and the figures. Pure numpy and Python; nothing here
knows how a curve is drawn.

- **Rows**: ``rank``, ``step``, ``attempt``, ``time`` and one column per metric (:class:`RunHistory` holds
  them as a DataFrame; the dashboard feeds them in batches to its bounded buffer instead).
- **Branches** and **replaced rows**: which rows a rewind superseded and which a later attempt replaced, decided
  by :mod:`nbtrain._cluster.storage.history_rules` (the rules every process that reads a run's rows shares: the head
  reading a run's files, a sweep's trial table).
- **Marks** (:class:`Mark`): typed, at a step, with nbtrain's label.
- **Counters**: a metric that only counts (``epoch`` beside the loss: whole numbers that never go down) is
  progress, not a curve (:class:`CountWatch`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from nbtrain._cluster.command_kinds.table import command_kind
from nbtrain._cluster.storage.history_rules import (
    Bools,
    Branch,
    attempt_starts,
    branch_of_rows,
    branches_of,
    replaced_mask,
    superseded_mask,
)

RESERVED = ("rank", "step", "attempt", "time")  # every row's own columns; the rest are metrics
SUPERSEDED = "superseded"                       # the column run.metrics_frame() adds

# Mark kinds that are not a command's: the others are named after the command kind that made them (``adjust``,
# ``rewind``, ``patch``, ``pause``, ``checkpoint``, ``exec``: each kind says whether it is marked).
RESIZE = "resize"     # an elastic run went on at another size (a new attempt)
RESTART = "restart"   # a new attempt after a failure, a supervisor restart or a resume
GUARD_TRIP = "guard"  # a guard saw a non-finite or spiking loss



@dataclass(frozen=True)
class Mark:
    """A moment of the run drawn across its curves: ``kind`` (a marked command kind's name, or :data:`RESIZE`,
    :data:`RESTART`, :data:`GUARD_TRIP`), the ``step`` it is drawn at and its ``label``."""

    step: float
    kind: str
    label: str


def marks_of(summary: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
             starts: Mapping[int, int]) -> list[Mark]:
    """The run's marks by step: each applied change of a marked kind at the step it applied (a rewind's at the step
    it went back to), each new attempt where it resumed (a resize says its sizes), each guard trip where it saw
    the trouble. ``starts``: :func:`attempt_starts`."""
    marks = []
    for change in summary.get("changes") or []:
        kind = command_kind(change["kind"])
        step = change.get("applied_step")
        if step is None or not kind.marked:
            continue
        if kind.goes_back:
            step = int(change["args"]["to_step"])
            marks.append(Mark(step, change["kind"], f"rewound to step {step}"))
        else:
            marks.append(Mark(step, change["kind"], change["description"].rsplit(" at step ", 1)[0]))
    resized: dict[int, Mapping[str, Any]] = {}
    for event in events:
        if event.get("kind") == "resize" and event.get("to_size") is not None:
            resized[int(event["attempt"]) + 1] = event
        elif event.get("kind") == "guard" and event.get("tripped") is not None:
            marks.append(Mark(int(event["step"]), GUARD_TRIP, f"guard: {event['tripped']} at step {event['step']}"))
    for attempt, step in starts.items():
        said = resized.get(attempt)
        if said is not None:
            marks.append(Mark(step, RESIZE, f"{said['from_size']} → {said['to_size']} ranks"))
        else:
            marks.append(Mark(step, RESTART, f"attempt {attempt}"))
    return sorted(marks, key=lambda mark: mark.step)


class CountWatch:
    """Whether a metric only counts (reported as integers >= 0, never lower than the rank's last in the attempt),
    decided a batch at a time: ``epoch`` beside the loss is progress, not a curve. A float that happens to be
    whole (a loss of 1.0) is a measurement, not a count."""

    def __init__(self) -> None:
        self.counts = True
        self._last: dict[int, float] = {}

    def take(self, ranks: npt.NDArray[Any], values: npt.NDArray[np.float64], integers: bool) -> bool:
        """Rows of one attempt, in report order (``integers``: every value was reported as an int); whether the
        metric still only counts."""
        if not integers:
            self.counts = False
        if not self.counts or not len(values):
            return self.counts
        finite = np.isfinite(values)
        ranks, values = ranks[finite], values[finite]
        if not len(values):
            return self.counts
        if np.any(values != np.floor(values)) or np.any(values < 0):
            self.counts = False
            return False
        order = np.argsort(ranks, kind="stable")
        r, v = ranks[order], values[order]
        starts = np.concatenate([[0], np.flatnonzero(np.diff(r)) + 1])
        previous = np.empty_like(v)
        previous[1:] = v[:-1]
        previous[starts] = [self._last.get(int(rank), -math.inf) for rank in r[starts]]
        if np.any(v < previous):
            self.counts = False
            return False
        ends = np.concatenate([starts[1:], [len(r)]]) - 1
        self._last.update(zip(r[ends].tolist(), v[ends].tolist()))
        return True

    def new_attempt(self) -> None:
        """A new attempt resumes from a checkpoint: it may count again from an earlier value."""
        self._last.clear()


@dataclass
class RunHistory:
    """A run's whole history as read once: its rows (a DataFrame with ``rank``, ``step``, ``attempt``, ``time``
    and a column per metric), its summary and its events; with the branches, marks and counters decided from
    them.

    >>> rows = [{"rank": 0, "step": s, "attempt": 1, "time": float(s), "loss": 1.0, "epoch": s // 2}
    ...         for s in range(1, 5)]
    >>> history = RunHistory.of_rows({"changes": []}, [], rows)
    >>> history.metrics, history.counters
    (['loss'], {'epoch': 2})
    """

    summary: Mapping[str, Any]
    events: Sequence[Mapping[str, Any]]
    rows: Any                                              # pandas.DataFrame
    integer_metrics: frozenset[str] | None = None          # reported as ints (None: as the columns' types say)
    branches: tuple[Branch, ...] = field(init=False)
    starts: dict[int, int] = field(init=False)
    superseded: Bools = field(init=False)                  # per row: left by a rewind
    current: Bools = field(init=False)                     # per row: neither superseded nor replaced by an attempt
    marks: list[Mark] = field(init=False)

    def __post_init__(self) -> None:
        self._columns: dict[str, npt.NDArray[Any]] = {}
        self._means: dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = {}
        self.branches = branches_of(self.summary)
        ranks, steps, attempts, times = (self.column(name) for name in RESERVED)
        self.starts = attempt_starts(attempts, steps)
        self.superseded = superseded_mask(self.branches, ranks, steps, times)
        self.current = ~self.superseded & ~replaced_mask(attempts, steps, self.starts)
        self.marks = marks_of(self.summary, self.events, self.starts)
        self._numeric: dict[str, npt.NDArray[np.float64]] = {}
        self._integers: set[str] = set()
        for name in self.rows.columns:
            if name not in RESERVED and name != SUPERSEDED:
                values, integers = _numbers(self.rows[name])
                if values is not None:
                    self._numeric[name] = values
                    if integers if self.integer_metrics is None else name in self.integer_metrics:
                        self._integers.add(name)
        self.counters: dict[str, int] = {name: latest for name in self._numeric
                         if (latest := self._only_counts(name)) is not None}
        self.metrics = sorted(name for name in self._numeric if name not in self.counters)

    @classmethod
    def of_rows(cls, summary: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                rows: Sequence[Mapping[str, Any]]) -> RunHistory:
        """From rows as dicts (``run.metrics``' form)."""
        import pandas as pd

        frame = pd.DataFrame(list(rows)) if rows else pd.DataFrame({name: [] for name in RESERVED})
        for name in RESERVED:
            if name not in frame:
                frame[name] = 1 if name == "attempt" else 0.0
        kinds: dict[str, set[type]] = {}
        for row in rows:
            for name, value in row.items():
                kinds.setdefault(name, set()).add(type(value))
        return cls(summary, events, frame, frozenset(name for name, seen in kinds.items() if seen == {int}))

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> npt.NDArray[Any]:
        """A reserved column as numbers (an attempt missing from an old row reads as 1)."""
        found = self._columns.get(name)
        if found is not None:
            return found
        if name not in self.rows or not len(self.rows):
            found = np.zeros(len(self.rows), dtype=np.int64 if name != "time" else float)
        elif name == "attempt":
            found = np.nan_to_num(self.rows[name].to_numpy().astype(float), nan=1.0).astype(np.int64)
        else:
            values = self.rows[name].to_numpy()
            found = values.astype(float) if name in ("time", "step") else values.astype(np.int64)
        self._columns[name] = found
        return found

    def frame(self) -> Any:
        """The rows with the :data:`SUPERSEDED` column: ``run.metrics_frame()``."""
        frame = self.rows.copy()
        frame[SUPERSEDED] = self.superseded
        return frame

    def values(self, metric: str, rows: Bools | None = None) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64],
                                                                      npt.NDArray[np.float64]]:
        """(ranks, steps, values) of ``metric`` where it was reported, among ``rows`` (default: the current ones),
        each rank's in step order."""
        if metric not in self._numeric:
            return np.empty(0, dtype=np.int64), np.empty(0), np.empty(0)
        chosen = (self.current if rows is None else rows) & ~np.isnan(self._numeric[metric])
        order = self._order[chosen[self._order]]
        return self.column("rank")[order], self.column("step")[order], self._numeric[metric][order]

    @functools.cached_property
    def _order(self) -> npt.NDArray[np.int64]:
        """Every row's index, by rank, then step (then report order)."""
        order: npt.NDArray[np.int64] = np.lexsort((self.column("step"), self.column("rank")))
        return order

    def mean(self, metric: str, rows: Bools | None = None) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(steps, mean across ranks) of ``metric`` among ``rows`` (default: the current ones); non-finite values
        are left out of a step's mean."""
        if rows is None and metric in self._means:
            return self._means[metric]
        _ranks, steps, values = self.values(metric, rows)
        finite = np.isfinite(values)
        steps, values = steps[finite], values[finite]
        low = steps.min() if len(steps) else 0.0
        if len(steps) and np.all(steps == np.floor(steps)) and steps.max() - low <= 4 * len(steps):
            where = (steps - low).astype(np.int64)  # whole steps, densely reported: counted without a sort
            counts = np.bincount(where)
            held = np.flatnonzero(counts)
            at, sums, counts = held + low, np.bincount(where, weights=values)[held], counts[held]
        else:
            at, where = np.unique(steps, return_inverse=True)
            sums, counts = np.bincount(where, weights=values, minlength=len(at)), np.bincount(where, minlength=len(at))
        found = (at.astype(float), sums / np.maximum(counts, 1))
        if rows is None:
            self._means[metric] = found
        return found

    def first_times(self, metric: str) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(steps, the first time any rank reported ``metric`` at each) among the current rows."""
        if metric not in self._numeric:
            return np.empty(0), np.empty(0)
        chosen = self.current & ~np.isnan(self._numeric[metric])
        at, where = np.unique(self.column("step")[chosen], return_inverse=True)
        first = np.full(len(at), np.inf)
        np.minimum.at(first, where, self.column("time")[chosen])
        return at, first

    def branch_rows(self) -> list[tuple[Branch, Bools]]:
        """Each branch with the rows drawn with it (a row two branches hold is drawn with the first)."""
        index = branch_of_rows(self.branches, self.column("rank"), self.column("step"), self.column("time"))
        return [(branch, index == number) for number, branch in enumerate(self.branches)
                if np.any(index == number)]

    def _only_counts(self, metric: str) -> int | None:
        """The latest value of ``metric`` if it only counts (see :class:`CountWatch`), else None."""
        ranks, _steps, values = self.values(metric)
        if not len(values) or not CountWatch().take(ranks, values, metric in self._integers):
            return None
        return int(np.nanmax(values))


def _numbers(column: Any) -> tuple[npt.NDArray[np.float64] | None, bool]:
    """A metric column as floats (NaN where a row lacks it; None when it holds no number: text), and whether every
    value was reported as an integer (a frame's column of ints with gaps is floats: its values say it)."""
    values = column.to_numpy()
    if values.dtype.kind in "iu":
        return values.astype(float), True
    if values.dtype.kind == "b":
        return None, False
    if values.dtype.kind == "f":
        return values.astype(float), False
    present = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not present:
        return None, False
    numbers = np.array([float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
                        for v in values], dtype=float)
    return numbers, all(isinstance(v, int) for v in present)
