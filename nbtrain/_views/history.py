"""Metric rows regrouped for drawing: per metric, per rank, sorted by step.

Rows arrive in order per rank almost always, so a new point is an append; a
restart that resumes from an earlier step (or a late batch) replaces the
overlapping tail, so the curve shows the attempt that counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

RESERVED = frozenset({"rank", "step", "attempt", "time"})


class MetricHistory:
    def __init__(self) -> None:
        self._series: dict[str, dict[int, tuple[list[float], list[float]]]] = {}
        self.rows_seen = 0
        self.latest: dict[str, float] = {}
        self.text: dict[int, dict[str, str]] = {}  # rank -> the last text (or true/false) of each metric

    def add(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.rows_seen += 1
            rank, step = row["rank"], row["step"]
            for key, value in row.items():
                if key in RESERVED:
                    continue
                if isinstance(value, (str, bool)):  # not drawn as a curve: shown in the worker table
                    self.text.setdefault(rank, {})[key] = str(value)
                    continue
                if not isinstance(value, (int, float)):
                    continue
                xs, ys = self._series.setdefault(key, {}).setdefault(rank, ([], []))
                if xs and step <= xs[-1]:
                    cut = int(np.searchsorted(np.asarray(xs), step, side="left"))
                    del xs[cut:], ys[cut:]
                xs.append(step)
                ys.append(float(value))
                self.latest[key] = float(value)

    @property
    def metrics(self) -> list[str]:
        return sorted(self._series)

    def groups(self) -> dict[str, list[str]]:
        """Losses together, accuracies together, everything else on its own."""
        grouped: dict[str, list[str]] = {}
        for name in self.metrics:
            lowered = name.lower()
            if "loss" in lowered:
                grouped.setdefault("loss", []).append(name)
            elif "acc" in lowered:
                grouped.setdefault("accuracy", []).append(name)
            else:
                grouped.setdefault(name, []).append(name)
        return grouped

    def per_rank(self, metric: str) -> dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
        return {rank: (np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
                for rank, (xs, ys) in sorted(self._series.get(metric, {}).items())}

    def mean(self, metric: str) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        ranks = self.per_rank(metric)
        if not ranks:
            return np.empty(0), np.empty(0)
        steps = np.concatenate([xs for xs, _ in ranks.values()])
        values = np.concatenate([ys for _, ys in ranks.values()])
        unique, inverse = np.unique(steps, return_inverse=True)
        sums = np.bincount(inverse, weights=values)
        counts = np.bincount(inverse)
        return unique, sums / counts
