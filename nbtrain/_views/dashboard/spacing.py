"""How far apart a series' reports are, and what that means for drawing it: one rule for every picture nbtrain
draws (the live charts widget, the static SVG, the plotly figures).

- A series reported much more rarely than the densest one beside it (``epoch_loss`` once an epoch next to ``loss``
  each step: its usual gap ``SPARSE_FACTOR`` times the densest one's or more) is drawn as points, never joined.
- A line is not drawn across a stretch with no report wider than ``GAP_FACTOR`` times the series' usual gap:
  such a stretch is a *break*, said by the step in its middle (each renderer leaves its line open there).

Breaks are found where the reports are known (the steps reported, before any thinning), so a thinned curve's
widely spaced points are still joined and a real gap in it still breaks.
"""

from __future__ import annotations

import numpy as np

from nbtrain._views.dashboard.downsample import Array, Points

GAP_FACTOR = 10          # a stretch with no report this many times the usual gap breaks the line
SPARSE_FACTOR = 3        # a series reported this many times more rarely than the densest: points, not a line
MAX_BREAKS = 64          # per trace handed to a renderer (the latest): what a chart's description carries


def usual_gap(steps: Points) -> float:
    """The median step between consecutive distinct reports (1 when there are too few to tell)."""
    gaps = np.diff(np.unique(np.asarray(steps, dtype=float)))
    return float(np.median(gaps)) if len(gaps) else 1.0


def is_sparse(usual: float, densest: float) -> bool:
    """Whether a series whose usual gap is ``usual`` is drawn as points beside one whose usual gap is ``densest``."""
    return usual > SPARSE_FACTOR * densest


def widest_allowed(usual: float) -> float:
    """The widest stretch with no report a line still crosses."""
    return max(GAP_FACTOR * usual, 1.0)


def breaks_between(lefts: Array, rights: Array, usual: float) -> Array:
    """The middle of each stretch from ``lefts[i]`` to ``rights[i]`` (two reports known to be consecutive) wider
    than the rule allows, in step order."""
    wide = (rights - lefts) > widest_allowed(usual)
    return np.sort((lefts[wide] + rights[wide]) / 2)


def breaks_of(steps: Points, usual: float | None = None) -> Array:
    """The breaks of a series reported at ``steps`` (every report, any order): gaps wider than the rule allows,
    given the series' ``usual`` gap (default: the median of its own)."""
    at = np.unique(np.asarray(steps, dtype=float))
    return breaks_between(at[:-1], at[1:], usual_gap(at) if usual is None else usual)


def latest(breaks: Array, most: int = MAX_BREAKS) -> Array:
    """At most ``most`` of ``breaks`` (sorted), the latest: what a chart's description carries to a renderer."""
    return breaks[-most:] if len(breaks) > most else breaks


def broken(x: Array, y: Array, breaks: Array) -> tuple[Array, Array]:
    """``(x, y)`` with a NaN point at each break that falls between two of its points, so that a renderer drawing
    no line through NaN (plotly, the static SVG) leaves the line open there."""
    if not len(breaks) or len(x) < 2:
        return x, y
    at = np.searchsorted(x, breaks, side="left")
    inside = (at > 0) & (at < len(x))
    at, middle = at[inside], breaks[inside]
    inside = (x[at - 1] < middle) & (middle < x[at])
    at, first = np.unique(at[inside], return_index=True)
    return np.insert(x, at, middle[inside][first]), np.insert(y, at, np.nan)
