"""Shrink a long curve for drawing without losing its shape.

Per bucket we keep the first, minimum, maximum and last point (the "M4"
scheme): spikes survive, the first and last points are always kept, and a
1,000,000-point curve becomes a few thousand points the browser draws at once.
The work is a handful of numpy calls whatever the number of buckets, so a
redraw costs the same at any history length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Points = Sequence[float] | Array


def _first_hits(hits: npt.NDArray[np.bool_], segment: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per segment, the index of its first True in ``hits`` (every segment has one)."""
    where = np.flatnonzero(hits)
    _, first = np.unique(segment[where], return_index=True)
    return where[first]


def downsample(xs: Points, ys: Points, max_points: int = 2000) -> tuple[Array, Array]:
    """At most ``max_points`` points of ``(xs, ys)``: first, min, max and last of equal-count buckets.

    Non-finite values (NaN, inf) are never picked as a bucket's minimum or maximum
    unless the whole bucket is non-finite.

    >>> x, y = downsample(range(10_000), [0.0] * 5000 + [9.0] + [0.0] * 4999, 40)
    >>> len(x) <= 40, 9.0 in y
    (True, True)
    """
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 4)
    edges = np.linspace(0, n, buckets + 1, dtype=np.int64)
    starts, sizes = edges[:-1], np.diff(edges)
    segment = np.repeat(np.arange(buckets, dtype=np.int64), sizes)
    finite = np.isfinite(y)
    low = np.where(finite, y, np.inf)
    high = np.where(finite, y, -np.inf)
    lowest = _first_hits(low == np.minimum.reduceat(low, starts)[segment], segment)
    highest = _first_hits(high == np.maximum.reduceat(high, starts)[segment], segment)
    index = np.unique(np.concatenate([starts, lowest, highest, edges[1:] - 1]))
    return x[index], y[index]
