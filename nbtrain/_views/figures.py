"""plotly figures of runs, for analysis: ``run.figure()``, and ``compare(...).figure()`` and ``sweep.figure()``
(:mod:`nbtrain._views.compare` gives them their curves).

Each reads a run's history model (:class:`~nbtrain._client.run.run_history.RunHistory`): the rows that count,
the branches rewinds left (drawn faded) and the marks (vertical lines, nbtrain's labels, styled as the dashboard
styles them). What is drawn reads well: a subplot per metric; per rank a thin translucent line and across ranks a
thick dark mean (a wide run: the mean and its min-max band); a metric that only counts (``epoch``) is said in the
title, not drawn; a metric reported more rarely than the run's steps (``epoch_loss``) is drawn as points, and no
line is drawn across a gap in a metric's steps (the rule every picture of nbtrain follows:
:mod:`~nbtrain._views.dashboard.spacing`); the legend sits right of the plots; the looks are the charts widget's
(:mod:`~nbtrain._views.dashboard.chart`). Every trace is downsampled as
the dashboard's curves are (:func:`~nbtrain._views.dashboard.downsample.downsample`: at most ``MAX_POINTS``,
each bucket's first, minimum, maximum and last kept), whatever the run's length.

How a figure shows in a notebook (:class:`NbtrainFigure`): plotly's own default in a Jupyter kernel writes only
the figure's JSON (``application/vnd.plotly.v1+json``), which JupyterLab, Notebook 7 (plotly's extension) and VS
Code draw but nbconvert's HTML and Colab do not; its ``notebook`` renderer embeds plotly.js (4-5 MB) in the saved
notebook. So these figures show themselves as that JSON plus an HTML version that loads plotly.js from plotly's
CDN (one script tag, ~200 bytes): no copy of plotly.js in the saved file, whatever the number of figures.
``fig.show(renderer=...)`` still takes any plotly renderer.

plotly is imported here, and this module only when a figure is asked for: ``import nbtrain`` stays light.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nbtrain._client.run.run_history import Mark, RunHistory
from nbtrain._exceptions import InvalidOptionError
from nbtrain._views.dashboard.chart import (
    BRANCH_COLOUR,
    BRANCH_OPACITY,
    BRANCH_WIDTH,
    MAX_POINTS,
    MEAN_COLOUR,
    MEAN_WIDTH,
    RANK_OPACITY,
    RANK_WIDTH,
    colour_of,
)
from nbtrain._views.dashboard.downsample import Array, downsample
from nbtrain._views.dashboard.mark_styles import style_of
from nbtrain._views.dashboard.spacing import breaks_of, broken, is_sparse, usual_gap

WIDE_RANKS = 8           # above this many ranks: the mean and its min-max band, no line per rank
MAX_MARKS = 200          # marks drawn at most (the latest); the title says how many more
ROW_HEIGHT = 260         # pixels per subplot
EXACT_FLOAT32 = 2 ** 24  # steps below this are exact in float32 (half the bytes of float64 in a saved notebook)


class NbtrainFigure(go.Figure):  # type: ignore[misc]
    """A ``plotly.graph_objects.Figure`` that shows itself in a notebook without a copy of plotly.js (see the
    module's docstring); everything else is plotly's (``fig.show()`` included)."""

    def _ipython_display_(self) -> None:
        """A cell's value or ``display(fig)``: plotly's own would go through its renderers (see above)."""
        from IPython.display import display

        display(display_bundle(self), raw=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, Any]:
        return display_bundle(self)


def display_bundle(figure: Any) -> dict[str, Any]:
    """What a notebook stores for ``figure``: plotly's JSON (JupyterLab, Notebook 7, VS Code), HTML loading
    plotly.js from its CDN (nbconvert's HTML, Colab, a front end without plotly's extension) and a line of text
    (a terminal)."""
    import plotly.io as pio

    height = figure.layout.height
    html = pio.to_html(figure, include_plotlyjs="cdn", full_html=False, validate=False,
                       default_height=f"{height}px" if height else "100%")
    return {"application/vnd.plotly.v1+json": json.loads(pio.to_json(figure, validate=False, remove_uids=False)),
            "text/html": html,
            "text/plain": f"<plotly Figure: {figure.layout.title.text or 'untitled'}, {len(figure.data)} traces>"}


def run_figure(run: Any, metrics: str | Sequence[str] | None = None) -> NbtrainFigure:
    """``run.figure(metrics)``: the run's history as it is now (a live run's too)."""
    return history_figure(run.name, run.reader.history(), metrics)


def history_figure(name: str, history: RunHistory, metrics: str | Sequence[str] | None = None) -> NbtrainFigure:
    """A subplot per metric (``metrics``: those named, in that order), ranks, mean, branches and marks."""
    chosen = _chosen(name, history, metrics)
    state = history.summary.get("state")
    said = f"{name}" + (f" ({state})" if state else "")
    if not len(history):
        return NbtrainFigure(layout={"title": {"text": f"{said}: no rows yet"}, "template": "plotly_white",
                                     "height": ROW_HEIGHT + 120})
    counted = ", ".join(f"{counter} {value}" for counter, value in history.counters.items() if counter not in chosen)
    rows = f"{len(history):,} rows" + (f" · {counted}" if counted else "")
    figure: NbtrainFigure = _subplots(chosen)
    ranks = np.unique(history.column("rank"))
    wide = len(ranks) > WIDE_RANKS
    run_gap = usual_gap(history.column("step")[history.current])
    for row, metric in enumerate(chosen, 1):
        sparse = is_sparse(usual_gap(history.mean(metric)[0]), run_gap)
        for trace in (_band(history, metric, sparse) if wide else _ranks(history, metric, sparse)):
            figure.add_trace(trace, row=row, col=1)
        for trace in _branches(history, metric, sparse):
            figure.add_trace(trace, row=row, col=1)
        steps, mean = history.mean(metric)
        figure.add_trace(_line("mean of ranks", steps, mean, sparse, legend="mean", width=MEAN_WIDTH,
                               colour=MEAN_COLOUR),
                         row=row, col=1)
    _first_in_legend(figure)
    shown = history.marks[-MAX_MARKS:]
    more = len(history.marks) - len(shown)
    ranks_said = f"{len(ranks)} ranks: mean and min–max band" if wide else f"{len(ranks)} rank" + (
        "s" if len(ranks) != 1 else "")
    figure.update_layout(title={"text": f"{said} · {rows} · {ranks_said}" + (f" · {more} more marks" if more else "")},
                         **_marks(shown, list(figure.layout.annotations)))
    return figure


def comparison_figure(title: str, curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                      xlabel: str = "step") -> NbtrainFigure:
    """One trace per run (its mean across ranks), on one plot: ``compare(...).figure()``, ``sweep.figure()``."""
    figure = NbtrainFigure()
    gaps = [usual_gap(xs) for xs, _ys in curves.values() if len(xs)]
    densest = min(gaps, default=1.0)
    for index, (name, (xs, ys)) in enumerate(curves.items()):
        x = np.asarray(xs, dtype=float)
        figure.add_trace(_line(name, x, np.asarray(ys, dtype=float), is_sparse(usual_gap(x), densest), legend=name,
                               width=MEAN_WIDTH, colour=colour_of(index)))
    _layout(figure, 1)
    figure.update_layout(title={"text": title if curves else f"{title}: no rows yet"})
    figure.update_xaxes(title_text=xlabel)
    return figure


# ---------------------------------------------------------------------- what is drawn
def _chosen(name: str, history: RunHistory, metrics: str | Sequence[str] | None) -> list[str]:
    """The metrics to draw: those named (known to the run), or every one but the counters."""
    if metrics is None:
        return list(history.metrics)
    asked = [metrics] if isinstance(metrics, str) else list(metrics)
    if not asked or not all(isinstance(metric, str) for metric in asked):
        raise InvalidOptionError(f"run.figure(metrics=...) is a metric's name or a list of them (None: every "
                                 f"metric); got {metrics!r}.")
    known = [*history.metrics, *history.counters]
    unknown = [metric for metric in asked if metric not in known]
    if unknown and len(history):
        has = ", ".join(repr(metric) for metric in history.metrics) or "none that is drawn"
        counters = f" (and {', '.join(repr(c) for c in history.counters)}, which only count)" \
            if history.counters else ""
        raise InvalidOptionError(f"run {name!r} has no metric {', '.join(map(repr, unknown))}: it has {has}"
                                 f"{counters}. Give one of those, or metrics=None for all.")
    return asked if len(history) else []


def _ranks(history: RunHistory, metric: str, sparse: bool) -> list[Any]:
    """A thin translucent line (or points) per rank, its colour the rank's."""
    ranks, steps, values = history.values(metric)
    starts = np.flatnonzero(np.diff(ranks, prepend=-1)) if len(ranks) else np.empty(0, dtype=np.int64)
    traces = []
    for begin, end in zip(starts, [*starts[1:], len(ranks)]):
        rank = int(ranks[begin])
        traces.append(_line(f"rank {rank}", steps[begin:end], values[begin:end], sparse, legend=f"rank {rank}",
                            width=RANK_WIDTH, colour=colour_of(rank), opacity=RANK_OPACITY))
    return traces


def _band(history: RunHistory, metric: str, sparse: bool) -> list[Any]:
    """A wide run: the min-max band across ranks at each step, under the mean."""
    _ranks_of, steps, values = history.values(metric)
    finite = np.isfinite(values)
    at, where = np.unique(steps[finite], return_inverse=True)
    low = np.full(len(at), np.inf)
    high = np.full(len(at), -np.inf)
    np.minimum.at(low, where, values[finite])
    np.maximum.at(high, where, values[finite])
    x_low, y_low = downsample(at, low, MAX_POINTS)
    x_high, y_high = downsample(at, high, MAX_POINTS)
    mode = "markers" if sparse else "lines"
    return [go.Scatter(x=_compact(x_low), y=_compact(y_low), mode=mode, name="min across ranks",
                       legendgroup="band", line={"width": 0, "color": colour_of(0)}, showlegend=False,
                       hoverinfo="skip"),
            go.Scatter(x=_compact(x_high), y=_compact(y_high), mode=mode, name="min–max across ranks",
                       legendgroup="band", line={"width": 0, "color": colour_of(0)}, fill="tonexty",
                       fillcolor="rgba(31,119,180,0.2)")]


def _branches(history: RunHistory, metric: str, sparse: bool) -> list[Any]:
    """The mean of each branch a rewind left, faded and dashed, from the step after the one it went back to."""
    traces = []
    for branch, rows in history.branch_rows():
        steps, mean = history.mean(metric, rows)
        if len(steps):
            traces.append(_line(f"left by the rewind to step {branch.to_step}", steps, mean, sparse,
                                legend="branches", width=BRANCH_WIDTH, colour=BRANCH_COLOUR, opacity=BRANCH_OPACITY,
                                dash="dash"))
    return traces


def _line(name: str, steps: Array, values: Array, sparse: bool, *, legend: str, width: float, colour: str,
          opacity: float = 1.0, dash: str | None = None) -> Any:
    """One trace, downsampled, its line broken across gaps (points only for a sparse metric)."""
    x, y = downsample(steps, values, MAX_POINTS)
    if not sparse:
        x, y = broken(x, y, breaks_of(steps))
    return go.Scatter(x=_compact(x), y=_compact(y), name=name, legendgroup=legend, opacity=opacity,
                      mode="markers" if sparse else "lines",
                      line={"width": width, "color": colour, **({"dash": dash} if dash else {})},
                      marker={"size": 4 + width, "color": colour})


def _compact(values: Array) -> npt.NDArray[Any]:
    """Half the bytes in a saved notebook: float32 where it is exact enough (steps below 2^24, any value)."""
    finite = values[np.isfinite(values)]
    if len(finite) and np.all(finite == np.round(finite)) and np.abs(finite).max() >= EXACT_FLOAT32:
        return values
    return values.astype(np.float32)


# ---------------------------------------------------------------------- the frame
def _subplots(metrics: list[str]) -> Any:
    figure = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, subplot_titles=metrics,
                           vertical_spacing=min(0.08, 0.3 / max(1, len(metrics))), figure=NbtrainFigure())
    _layout(figure, len(metrics))
    figure.update_xaxes(title_text="step", row=len(metrics), col=1)
    return figure


def _layout(figure: Any, rows: int) -> None:
    """The legend right of the plots (never over a curve), hover across traces at a step, a plain template."""
    figure.update_layout(template="plotly_white", height=ROW_HEIGHT * rows + 140, hovermode="x",
                         legend={"x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"},
                         margin={"r": 200, "t": 90})


def _first_in_legend(figure: Any) -> None:
    """Each legend group (a rank, the mean, the branches) once in the legend, not once per subplot."""
    seen: set[str] = set()
    for trace in figure.data:
        group = trace.legendgroup
        trace.showlegend = group not in seen and trace.showlegend is not False
        seen.add(group)


def _marks(marks: list[Mark], annotations: list[Any]) -> dict[str, Any]:
    """A vertical line across every subplot at each mark, labelled above the plots (``annotations``: those the
    layout has already, the subplots' titles)."""
    shapes, labels = [], []
    for mark in marks:
        style = style_of(mark)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": mark.step, "x1": mark.step, "y0": 0,
                       "y1": 1, "line": {"color": style.colour, "width": 1, "dash": style.dash}, "layer": "below"})
        labels.append({"x": mark.step, "xref": "x", "yref": "paper", "y": 1, "yanchor": "bottom", "text": mark.label,
                       "showarrow": False, "textangle": -30, "xanchor": "left", "font": {"size": 9,
                                                                                         "color": style.colour}})
    return {"shapes": shapes, "annotations": [*annotations, *labels]}
