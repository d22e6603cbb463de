"""A sweep trial's curve of the metric, as the sweep's table gives it: one point per Tune iteration, kept only
while its row still counts in the trial's run.

Tune counts every row of rank 0 that carries the sweep's metric as an iteration, and its schedulers compare
those values. A trial's run may go back over steps it already reported, though: a restart resumes from the
latest checkpoint (``max_failures``), a guard or ``run.rewind()`` goes back in place. The rows it left no longer
count in the run's history (``run.metrics_frame()``, the run's dashboard, ``sweep.figure()``); here they leave the
sweep's curve too, decided by the same rules (:mod:`nbtrain._cluster.storage.history_rules`) from what each point's row
was (its run, attempt, step and time, which the trial hands Tune under :data:`ROW_IDENTITY`) and the rewinds
the trial saw its run record. The x axis stays Tune's iteration (what ASHA's rungs are in): a trial that went
back shows a gap where the iterations it replaced were, its line broken there (:meth:`TrialCurve.breaks`). A PBT
exploit starts a new run for the trial; each run's rows are judged with that run's own attempts and rewinds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbtrain._cluster.storage.history_rules import branches_of_commands, left_out

ROW_IDENTITY = "nbtrain_row"  # the result key a trial's row (run, attempt, step, time) reaches the table under


@dataclass(frozen=True)
class Point:
    iteration: int
    value: float
    run: str | None = None     # None: a result without a row (a trial restored at its end repeats its last): it counts
    attempt: int = 1
    step: int = 0
    time: float = math.inf


class TrialCurve:
    """The points Tune reported for one trial, and which of them count (worked out again only when asked after a
    change)."""

    def __init__(self) -> None:
        self._points: list[Point] = []
        self._rewinds: dict[str, list[dict[str, Any]]] = {}
        self._counted: tuple[list[Point], list[float]] | None = ([], [])

    def add(self, iteration: int, value: float, row: Mapping[str, Any] | None) -> None:
        """One Tune result: its iteration, the metric's value and the row's identity (:data:`ROW_IDENTITY`)."""
        if isinstance(row, Mapping) and isinstance(row.get("step"), int):
            attempt = row.get("attempt")
            when = row.get("time")
            point = Point(iteration, value, str(row.get("run")), attempt if isinstance(attempt, int) else 1,
                          row["step"], float(when) if isinstance(when, (int, float)) else math.inf)
        else:
            point = Point(iteration, value)
        self._points.append(point)
        self._counted = None

    def note_rewinds(self, run: str, commands: Sequence[Mapping[str, Any]]) -> None:
        """The rewinds ``run`` records as of now (its summary's ``changes`` of a kind that goes back)."""
        self._rewinds[run] = [dict(command) for command in commands]
        self._counted = None

    def points(self) -> list[tuple[int, float]]:
        """``(iteration, value)`` of each point that counts, in Tune's order."""
        return [(point.iteration, point.value) for point in self._counting()[0]]

    def breaks(self) -> list[float]:
        """Where the curve's line breaks: midway between the two points that count on either side of points left
        out (a line across them would join values from two branches of the run)."""
        return list(self._counting()[1])

    def last(self) -> float | None:
        counted = self._counting()[0]
        return counted[-1].value if counted else None

    def best(self, mode: str) -> float | None:
        """The best finite value that counts (``mode``: ``"min"`` or ``"max"``)."""
        finite = [point.value for point in self._counting()[0] if math.isfinite(point.value)]
        if not finite:
            return None
        return min(finite) if mode == "min" else max(finite)

    def _counting(self) -> tuple[list[Point], list[float]]:
        """The points that count, and the breaks between them."""
        if self._counted is None:
            left = np.zeros(len(self._points), dtype=bool)
            for run in {point.run for point in self._points if point.run is not None}:
                where = np.array([index for index, point in enumerate(self._points) if point.run == run])
                steps = np.array([self._points[index].step for index in where])
                attempts = np.array([self._points[index].attempt for index in where])
                times = np.array([self._points[index].time for index in where])
                left[where] = left_out(branches_of_commands(self._rewinds.get(run, [])),
                                       np.zeros(len(where), dtype=np.int64), steps, attempts, times)
            counted, breaks, before, skipped = [], [], None, False
            for point, out in zip(self._points, left.tolist()):
                if out:
                    skipped = True
                    continue
                if skipped and before is not None:
                    breaks.append((before + point.iteration) / 2)
                counted.append(point)
                before, skipped = point.iteration, False
            self._counted = (counted, breaks)
        return self._counted
