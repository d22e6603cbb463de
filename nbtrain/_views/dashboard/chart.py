"""A chart as nbtrain describes it, whoever draws it: the live charts widget (:mod:`.charts_widget`, drawn by
``static/charts.js``) and the static SVG (:mod:`.static_plot`) take the same :class:`Chart`, so a run's, a
sweep's and a comparison's curves look the same live, in a saved notebook and in nbconvert's HTML. Also the looks
every picture shares (the plotly figures' too): a rank's thin translucent line, the thick dark mean, the faded
branch a rewind left, a faded trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbtrain._client.run.run_history import Mark
from nbtrain._views.dashboard.downsample import Array, Points, downsample
from nbtrain._views.dashboard.spacing import breaks_of, is_sparse, latest, usual_gap

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MEAN_COLOUR = "#222222"
BRANCH_COLOUR = "#999999"
RANK_WIDTH, RANK_OPACITY = 1.0, 0.45     # one rank's curve: thin, translucent
MEAN_WIDTH = 3.0                          # the mean across ranks (a run's, a comparison's run): thick
BRANCH_WIDTH, BRANCH_OPACITY = 1.5, 0.6   # a branch a rewind left: dashed, faded
FADED_OPACITY = 0.25                      # a trial a scheduler stopped, or one that failed
MAX_POINTS = 2000                         # per trace, unless its caller thins it further


def colour_of(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


@dataclass(eq=False)
class Trace:
    """One series of a chart: its points (already thinned to what is drawn), how it looks, and where its line
    breaks (:mod:`.spacing`: the middle of each stretch with no report too wide to cross)."""

    name: str
    xs: Array
    ys: Array
    colour: str
    width: float = 1.5
    opacity: float = 1.0
    dash: bool = False
    band: str = ""                      # "low" / "high": the edges of a shaded band (drawn as one area)
    points: bool = False                # a sparse series: a dot per report, never joined
    breaks: Array = field(default_factory=lambda: np.empty(0))

    def look(self) -> dict[str, Any]:
        """The trace as ``static/charts.js`` takes it (its points travel apart, as binary buffers)."""
        found: dict[str, Any] = {"name": self.name, "color": self.colour, "width": self.width}
        if self.opacity != 1.0:
            found["opacity"] = self.opacity
        if self.dash:
            found["dash"] = True
        if self.band:
            found["band"] = self.band
        if self.points:
            found["points"] = True
        if len(self.breaks):
            found["breaks"] = [float(x) for x in latest(self.breaks)]
        return found


@dataclass(eq=False)
class Chart:
    """A line chart: ``traces`` over ``xlabel``, with ``marks`` (vertical lines at steps, styled by kind:
    :mod:`.mark_styles`)."""

    id: str
    title: str
    traces: Sequence[Trace]
    marks: Sequence[Mark] = ()
    xlabel: str = "step"


def series(curves: Sequence[tuple[str, Points, Points, dict[str, Any]]], max_points: int = MAX_POINTS) -> list[Trace]:
    """Traces of whole series (every report at hand: a comparison's runs, a sweep's trials), each ``(name, xs, ys,
    looks)``: thinned to ``max_points``, broken across gaps (and at the ``breaks`` its looks may name: where its
    caller left points out), drawn as points when reported far more rarely than the densest of them."""
    arrays = [(name, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), looks) for name, xs, ys, looks in curves]
    gaps = {name: usual_gap(xs) for name, xs, _ys, _looks in arrays if len(xs) > 1}
    densest = min(gaps.values(), default=1.0)
    traces = []
    for name, xs, ys, looks in arrays:
        x, y = downsample(xs, ys, max_points)
        usual = gaps.get(name, densest)
        looks = dict(looks)
        breaks = np.union1d(breaks_of(xs, usual), np.asarray(looks.pop("breaks", ()), dtype=float))
        traces.append(Trace(name, x, y, points=is_sparse(usual, densest), breaks=breaks, **looks))
    return traces
