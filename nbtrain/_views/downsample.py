"""Shrink a long curve for drawing without losing its shape.

Per bucket we keep the first, minimum, maximum and last point (the "M4"
scheme): spikes survive, the first and last points are always kept, and a
1,000,000-point history becomes a few thousand points the browser draws at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Points = Sequence[float] | Array


def downsample(xs: Points, ys: Points, max_points: int = 2000) -> tuple[Array, Array]:
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 4)
    edges = np.linspace(0, n, buckets + 1, dtype=np.int64)
    keep: list[np.ndarray] = []
    for start, stop in itertools.pairwise(edges):
        if stop <= start:
            continue
        segment = y[start:stop]
        finite = np.where(np.isfinite(segment), segment, np.nan)
        if np.all(np.isnan(finite)):
            picks = [start, stop - 1]
        else:
            picks = [start, start + int(np.nanargmin(finite)), start + int(np.nanargmax(finite)), stop - 1]
        keep.append(np.asarray(picks, dtype=np.int64))
    index = np.unique(np.concatenate(keep))
    return x[index], y[index]
