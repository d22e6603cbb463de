"""One metric across a run's ranks, per step, in memory that does not grow with the run: what the dashboard's mean
and min-max band are drawn from.

Count, sum, minimum and maximum per step for the last ``BAND_RECENT_STEPS`` steps, and in ``BAND_BINS`` bins of
doubling width before that (the mean of a bin is drawn at the mean of its steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbtrain._views.dashboard.downsample import Array
from nbtrain._views.dashboard.spacing import breaks_between, widest_allowed

BAND_RECENT_STEPS = 1000
BAND_BINS = 1000        # even: bins merge in pairs


class RankBand:
    """One metric across ranks: count, sum, min and max per step (recent) or per bin of steps (older)."""

    def __init__(self) -> None:
        self.width = 1                                     # steps per coarse bin
        self.coarse = np.zeros((BAND_BINS, 5))             # count, sum of steps, sum, min, max
        self.coarse[:, 3], self.coarse[:, 4] = np.inf, -np.inf
        self.fine = np.zeros((BAND_RECENT_STEPS, 4))       # by step % BAND_RECENT_STEPS: count, sum, min, max
        self.fine[:, 2], self.fine[:, 3] = np.inf, -np.inf
        self.top = -1                                      # the highest step seen

    @property
    def nbytes(self) -> int:
        return self.coarse.nbytes + self.fine.nbytes

    @staticmethod
    def _clear(table: Array, rows: Any = slice(None)) -> None:
        """Empty ``table[rows]`` in place (sums 0, min +inf, max -inf)."""
        table[rows, :-2] = 0.0
        table[rows, -2], table[rows, -1] = np.inf, -np.inf

    def add(self, steps: Array, values: Array) -> None:
        keep = np.isfinite(values)
        s, v = np.maximum(steps[keep], 0).astype(np.int64), values[keep]
        if not len(s):
            return
        while s.max() >= BAND_BINS * self.width:
            merged = self.coarse.reshape(BAND_BINS // 2, 2, 5)
            halved = np.concatenate([merged[:, :, :3].sum(axis=1), merged[:, :, 3:4].min(axis=1),
                                     merged[:, :, 4:5].max(axis=1)], axis=1)
            self.coarse[:BAND_BINS // 2] = halved
            self._clear(self.coarse, slice(BAND_BINS // 2, None))
            self.width *= 2
        bins = s // self.width
        np.add.at(self.coarse[:, 0], bins, 1.0)
        np.add.at(self.coarse[:, 1], bins, s.astype(float))
        np.add.at(self.coarse[:, 2], bins, v)
        np.minimum.at(self.coarse[:, 3], bins, v)
        np.maximum.at(self.coarse[:, 4], bins, v)
        top = int(s.max())
        if top > self.top:
            if top - self.top >= BAND_RECENT_STEPS:
                self._clear(self.fine)
            else:
                self._clear(self.fine, np.arange(self.top + 1, top + 1) % BAND_RECENT_STEPS)
            self.top = top
        recent = s > self.top - BAND_RECENT_STEPS
        cells, v = s[recent] % BAND_RECENT_STEPS, v[recent]
        np.add.at(self.fine[:, 0], cells, 1.0)
        np.add.at(self.fine[:, 1], cells, v)
        np.minimum.at(self.fine[:, 2], cells, v)
        np.maximum.at(self.fine[:, 3], cells, v)

    def copy(self) -> RankBand:
        """An independent band holding the same counts (a rewind's branch starts as what was drawn)."""
        other = RankBand()
        other.width, other.top = self.width, self.top
        other.coarse, other.fine = self.coarse.copy(), self.fine.copy()
        return other

    def forget_from(self, step: int) -> None:
        """A new attempt resumes at ``step``: what earlier attempts reported from there on no longer counts."""
        step = max(step, 0)
        self._clear(self.coarse, slice(min(BAND_BINS, -(-step // self.width)), None))
        if step <= self.top:
            self._clear(self.fine, np.arange(max(step, self.top - BAND_RECENT_STEPS + 1), self.top + 1)
                        % BAND_RECENT_STEPS)
            self.top = step - 1

    def _coarse(self) -> tuple[Array, Array, Array]:
        """The non-empty bins before the recent window: their numbers, rows, and the steps they are drawn at."""
        start = self.top - BAND_RECENT_STEPS + 1
        bins = np.flatnonzero((self.coarse[:, 0] > 0) & (np.arange(BAND_BINS) * self.width < start))
        old = self.coarse[bins]
        return bins.astype(float), old, np.minimum(old[:, 1] / np.maximum(old[:, 0], 1), start - 0.5)

    def _fine(self) -> tuple[Array, Array]:
        """The recent steps some rank reported, and their rows."""
        steps = np.arange(max(self.top - BAND_RECENT_STEPS + 1, 0), self.top + 1)
        new = self.fine[steps % BAND_RECENT_STEPS]
        held = new[:, 0] > 0
        return steps[held].astype(float), new[held]

    def view(self) -> tuple[Array, Array, Array, Array]:
        """(steps, mean, min, max): coarse bins before the recent window, one point per step in it."""
        _bins, old, old_x = self._coarse()
        steps, new = self._fine()
        return (np.concatenate([old_x, steps]),
                np.concatenate([old[:, 2] / old[:, 0], new[:, 1] / new[:, 0]]),
                np.concatenate([old[:, 3], new[:, 2]]), np.concatenate([old[:, 4], new[:, 3]]))

    def breaks(self, usual: float) -> Array:
        """Where the drawn band's lines break (:mod:`~nbtrain._views.dashboard.spacing`), for a metric whose
        usual gap is ``usual``: between recent steps too far apart, and between bins with more empty bins between
        them than the rule allows (bins side by side are never a gap, however wide)."""
        bins, _old, old_x = self._coarse()
        empty = (np.diff(bins) - 1) * self.width > widest_allowed(usual)
        coarse = (old_x[:-1][empty] + old_x[1:][empty]) / 2
        steps, _new = self._fine()
        return np.concatenate([coarse, breaks_between(steps[:-1], steps[1:], usual)])
