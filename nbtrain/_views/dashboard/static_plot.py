"""The static renderer: every picture nbtrain leaves where no widget draws (a saved notebook reopened without its
widget state, nbconvert's HTML, GitHub's viewer, the docs' tutorials), as small SVG (a few KB, no JavaScript).

It draws the same :class:`~nbtrain._views.dashboard.chart.Chart` the live charts widget draws (a run's curves, a
sweep's trials, a comparison's runs): the same looks (a rank's thin translucent line, the thick mean, a faded
branch or trial), points for a sparse series, lines left open across gaps (:mod:`.spacing`), marks styled by kind
(:mod:`.mark_styles`), the legend right of the plot. Also a sweep's scatter of a hyperparameter against the
metric (:func:`svg_scatter`) and a finished run's summary (:func:`static_summary`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from nbtrain._views.dashboard.chart import Chart, Trace
from nbtrain._views.dashboard.downsample import downsample
from nbtrain._views.dashboard.history import MetricHistory
from nbtrain._views.dashboard.mark_styles import style_of
from nbtrain._views.dashboard.spacing import broken
from nbtrain._views.dashboard.step_time_plot import debug_hint
from nbtrain._views.dashboard.summary_text import STATE_COLOURS, elapsed, fmt_duration

STATIC_POINTS = 400      # per trace in a static picture, at most
STATIC_BUDGET = 3000     # per static chart, all its traces together (a sweep's 50 trials: 60 points each)
STATIC_FEWEST = 16       # per trace, however many share the budget
LEGEND_ROWS = 14         # legend entries at most; then "and N more"
LEGEND_CHARS = 24        # a legend entry's name, cut with "…" (the whole name in its tooltip)


@dataclass(frozen=True)
class Axes:
    """A chart's plot box inside its margins, and the data ranges it maps onto it (a flat range widened by one)."""

    width: int
    height: int
    margins: tuple[int, int, int, int]  # left, right, top, bottom
    x0: float
    x1: float
    y0: float
    y1: float

    @classmethod
    def fitted(cls, xs: Iterable[float], ys: Iterable[float], width: int, height: int,
               margins: tuple[int, int, int, int]) -> Axes:
        xs, ys = list(xs), list(ys)
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        return cls(width, height, margins, x0, x1 if x1 > x0 else x0 + 1, y0, y1 if y1 > y0 else y0 + 1)

    def sx(self, x: float) -> float:
        left, right = self.margins[:2]
        return float(left + (x - self.x0) / (self.x1 - self.x0) * (self.width - left - right))

    def sy(self, y: float) -> float:
        _, _, top, bottom = self.margins
        return float(self.height - bottom - (y - self.y0) / (self.y1 - self.y0) * (self.height - top - bottom))

    def frame(self, x_labels: tuple[str, str], y_format: str = ".4g") -> str:
        """The box, the y range at its two ends and the x range under it (labels given as text)."""
        left, right, top, bottom = self.margins
        low, high = (html.escape(label) for label in x_labels)
        return (f'<rect x="{left}" y="{top}" width="{self.width - left - right}" '
                f'height="{self.height - top - bottom}" fill="none" stroke="#ccc"/>'
                f'<text x="{left - 4}" y="{self.height - bottom + 4}" text-anchor="end">{self.y0:{y_format}}</text>'
                f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{self.y1:{y_format}}</text>'
                f'<text x="{left}" y="{self.height - 12}">{low}</text>'
                f'<text x="{self.width - right}" y="{self.height - 12}" text-anchor="end">{high}</text>')


def svg_open(width: int, height: int, title: str, left: int, css_class: str = "") -> str:
    """An SVG picture's opening tag and its bold title above the plot box (``title`` is escaped here)."""
    klass = f' class="{css_class}"' if css_class else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg"{klass} width="{width}" height="{height}" '
            f'style="font:11px sans-serif;background:#fff">'
            f'<text x="{left}" y="15" font-weight="bold">{html.escape(title)}</text>')


# ---------------------------------------------------------------------- line charts
def svg_chart(chart: Chart, width: int = 560, height: int = 260) -> str:
    """``chart`` as an SVG picture: what the charts widget draws live, drawn once."""
    margins = left, right, top, bottom = 52, 150, 24, 30
    each = min(STATIC_POINTS, max(STATIC_FEWEST, STATIC_BUDGET // max(1, len(chart.traces))))
    drawn = [(trace, *downsample(trace.xs, trace.ys, each)) for trace in chart.traces if len(trace.xs)]
    finite = [(x, y) for _trace, xs, ys in drawn for x, y in zip(xs.tolist(), ys.tolist()) if math.isfinite(y)]
    parts = [svg_open(width, height, chart.title, left, f"nbtrain-static-chart nbtrain-chart-{chart.id}")]
    if not finite:
        parts.append(f'<text x="{left}" y="{height // 2}">no reports yet</text></svg>')
        return "".join(parts)
    axes = Axes.fitted((p[0] for p in finite), (p[1] for p in finite), width, height, margins)
    parts.append(axes.frame((f"{axes.x0:g}", f"{chart.xlabel} {axes.x1:g}")))
    low = next((entry for entry in drawn if entry[0].band == "low"), None)
    high = next((entry for entry in drawn if entry[0].band == "high"), None)
    if low is not None and high is not None:
        parts.append(_band(axes, low[1], low[2], high[1], high[2], high[0].colour))
    for trace, xs, ys in drawn:
        if not trace.band:
            parts.append(_trace(axes, trace, xs, ys))
    for mark in chart.marks:
        if axes.x0 <= mark.step <= axes.x1:
            style, x = style_of(mark), axes.sx(mark.step)
            dash = "2,2" if style.dash == "dot" else "4,3"
            parts.append(f'<line class="nbtrain-mark" data-kind="{html.escape(mark.kind)}" x1="{x:.1f}" y1="{top}" '
                         f'x2="{x:.1f}" y2="{height - bottom}" stroke="{style.colour}" stroke-dasharray="{dash}"/>'
                         f'<text x="{x + 3:.1f}" y="{top + 10}" fill="{style.colour}" '
                         f'font-size="9">{html.escape(mark.label)}</text>')
    parts.append(_legend(width - right + 8, top, [trace for trace, _xs, _ys in drawn if trace.band != "low"]))
    parts.append("</svg>")
    return "".join(parts)


def _trace(axes: Axes, trace: Trace, xs: Any, ys: Any) -> str:
    """A line left open at each break and each non-finite value (a lone point between two: a dot), or, for a
    sparse series, a dot per report."""
    looks = (f'stroke="{trace.colour}" stroke-width="{trace.width:g}" stroke-opacity="{trace.opacity:g}"'
             + (' stroke-dasharray="5,3"' if trace.dash else ""))
    name = html.escape(trace.name)
    dot = max(2.0, trace.width)
    if trace.points:
        dots = "".join(f'<circle cx="{axes.sx(x):.1f}" cy="{axes.sy(y):.1f}" r="{dot + 0.5:g}"/>'
                       for x, y in zip(xs.tolist(), ys.tolist()) if math.isfinite(y))
        return (f'<g class="nbtrain-trace nbtrain-points" data-name="{name}" fill="{trace.colour}" '
                f'fill-opacity="{trace.opacity:g}">{dots}</g>')
    xs, ys = broken(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), trace.breaks)
    path, lone, run = [], [], []
    for x, y in [*zip(xs.tolist(), ys.tolist()), (math.nan, math.nan)]:
        if math.isfinite(y):
            run.append((axes.sx(x), axes.sy(y)))
            continue
        if len(run) == 1:
            lone.append(run[0])
        elif run:
            path.append("M" + "L".join(f"{px:.1f},{py:.1f}" for px, py in run))
        run = []
    drawn = f'<path class="nbtrain-trace" data-name="{name}" fill="none" {looks} d="{"".join(path)}"/>' if path else ""
    return drawn + "".join(f'<circle class="nbtrain-lone" data-name="{name}" cx="{px:.1f}" cy="{py:.1f}" r="{dot:g}" '
                           f'fill="{trace.colour}" fill-opacity="{trace.opacity:g}"/>' for px, py in lone)


def _band(axes: Axes, low_x: Any, low_y: Any, high_x: Any, high_y: Any, colour: str) -> str:
    up = [f"{axes.sx(x):.1f},{axes.sy(y):.1f}" for x, y in zip(high_x.tolist(), high_y.tolist()) if math.isfinite(y)]
    down = [f"{axes.sx(x):.1f},{axes.sy(y):.1f}" for x, y in zip(low_x.tolist()[::-1], low_y.tolist()[::-1])
            if math.isfinite(y)]
    if not up:
        return ""
    return f'<path class="nbtrain-band" fill="{colour}" fill-opacity="0.2" stroke="none" d="M{"L".join(up + down)}Z"/>'


def _legend(x: int, top: int, traces: Sequence[Trace]) -> str:
    """Right of the plot box, never over a curve: a swatch as the trace looks and its name."""
    parts = []
    for row, trace in enumerate(traces[:LEGEND_ROWS]):
        y = top + 8 + 13 * row
        name = trace.name if len(trace.name) <= LEGEND_CHARS else trace.name[:LEGEND_CHARS - 1] + "…"
        if trace.points:
            swatch = f'<circle cx="{x + 8}" cy="{y - 3}" r="2.5" fill="{trace.colour}"/>'
        else:
            swatch = (f'<line x1="{x}" x2="{x + 16}" y1="{y - 3}" y2="{y - 3}" stroke="{trace.colour}" '
                      f'stroke-width="{min(trace.width, 3):g}" stroke-opacity="{max(trace.opacity, 0.35):g}"'
                      + (' stroke-dasharray="4,2"' if trace.dash else "") + "/>")
        parts.append(f'<g class="nbtrain-legend">{swatch}<text x="{x + 20}" y="{y}" font-size="10">'
                     f'<title>{html.escape(trace.name)}</title>{html.escape(name)}</text></g>')
    if len(traces) > LEGEND_ROWS:
        parts.append(f'<text x="{x}" y="{top + 8 + 13 * LEGEND_ROWS}" font-size="10">and '
                     f"{len(traces) - LEGEND_ROWS} more</text>")
    return "".join(parts)


# ---------------------------------------------------------------------- scatter plots
class Dot(NamedTuple):
    """One point of a scatter plot: a value (a number, or anything else as a category), its metric, its looks."""

    x: Any
    y: float
    colour: str
    opacity: float
    tip: str


def svg_scatter(title: str, dots: Sequence[Dot], width: int = 250, height: int = 200) -> str:
    """``dots``: numbers on a log scale when they span two decades or more, anything else as evenly spaced
    categories."""
    margins = 50, 10, 24, 30
    left = margins[0]
    numbers = [dot for dot in dots if isinstance(dot.x, (int, float)) and not isinstance(dot.x, bool)]
    labels: list[str] = sorted({str(dot.x) for dot in dots}) if dots and not numbers else []
    at = [float(labels.index(str(dot.x))) for dot in dots] if labels else [float(dot.x) for dot in numbers]
    shown = list(dots) if labels else numbers
    parts = [svg_open(width, height, title, left, "nbtrain-sweep-scatter")]
    if not shown:
        return "".join(parts) + f'<text x="{left}" y="{height // 2}">no results yet</text></svg>'
    log = not labels and min(at) > 0 and max(at) / min(at) >= 100
    xs = [math.log10(x) for x in at] if log else at
    axes = Axes.fitted(xs, (dot.y for dot in shown), width, height, margins)
    low, high = (labels[0], labels[-1]) if labels else (f"{min(at):.3g}", f"{max(at):.3g}")
    parts.append(axes.frame((low, high + (" (log)" if log else "")), y_format=".3g"))
    for dot, x in zip(shown, xs):
        parts.append(f'<circle cx="{axes.sx(x):.1f}" cy="{axes.sy(dot.y):.1f}" r="4" fill="{dot.colour}" '
                     f'fill-opacity="{dot.opacity:g}"><title>{html.escape(dot.tip)}</title></circle>')
    return "".join(parts) + "</svg>"


# ---------------------------------------------------------------------- a finished run
def summary_line(run_name: str, summary: dict[str, Any], history: MetricHistory) -> str:
    """The finished run in one line of HTML, coloured by its state: never empty, whatever it reported."""
    state = summary["state"]
    latest = ", ".join(f"{k}={v:.4g}" for k, v in sorted(history.latest.items()))
    text = (f"Run {run_name}: {state} after {fmt_duration(elapsed(summary))}, "
            f"{summary.get('world_size')} workers, attempt {summary.get('attempt')}, "
            f"{history.rows_seen} metric rows. Final: {latest or 'no metrics'}.")
    return f'<p class="nbtrain-final" style="color:{STATE_COLOURS.get(state, "#000")}">{html.escape(text)}</p>'


def static_summary(run_name: str, summary: dict[str, Any], history: MetricHistory, charts: Sequence[Chart],
                   table: str = "") -> str:
    """The HTML a finished run's dashboard leaves: one line of outcome, its ``charts``, the workers' ``table``
    (HTML) as it ended, the failure."""
    error = summary.get("error")
    return (f'<div class="nbtrain-summary">{summary_line(run_name, summary, history)}'
            f'{"".join(svg_chart(chart) for chart in charts)}{table}'
            + debug_hint(run_name, summary)
            + (f'<pre style="color:#d62728">{html.escape(error)}</pre>' if error else "") + "</div>")
