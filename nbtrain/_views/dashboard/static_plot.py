"""A small SVG of a run's final curves: the static fallback of a dashboard's output.

Where widgets do not render (nbconvert's HTML, GitHub's viewer, a notebook reopened without its widget
state) the dashboard's output shows this picture (a few KB, no JavaScript) and a summary line instead, with
the same markers as the live curves (a resize, a change made while it ran).
:class:`Axes` is the frame every SVG chart of nbtrain draws in (this one, the
sweep's curves and its scatter plots).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbtrain._client.run.run_history import Mark
from nbtrain._views.dashboard.downsample import Points, downsample
from nbtrain._views.dashboard.history import MetricHistory
from nbtrain._views.dashboard.mark_styles import style_of
from nbtrain._views.dashboard.step_time_plot import debug_hint
from nbtrain._views.dashboard.summary_text import STATE_COLOURS, elapsed, fmt_duration

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")

SUPERSEDED = "superseded"  # a series name's end: the branch a rewind went back from, drawn faded


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


def summary_line(run_name: str, summary: dict[str, Any], history: MetricHistory) -> str:
    """The finished run in one line of HTML, coloured by its state: never empty, whatever it reported."""
    state = summary["state"]
    latest = ", ".join(f"{k}={v:.4g}" for k, v in sorted(history.latest.items()))
    text = (f"Run {run_name}: {state} after {fmt_duration(elapsed(summary))}, "
            f"{summary.get('world_size')} workers, attempt {summary.get('attempt')}, "
            f"{history.rows_seen} metric rows. Final: {latest or 'no metrics'}.")
    return f'<p class="nbtrain-final" style="color:{STATE_COLOURS.get(state, "#000")}">{html.escape(text)}</p>'


def static_summary(run_name: str, summary: dict[str, Any], history: MetricHistory, marks: Sequence[Mark],
                   table: str = "") -> str:
    """The HTML a finished run's dashboard leaves: one line of outcome, a chart per metric group, the workers'
    ``table`` (HTML) as it ended, the failure."""
    charts = [svg_chart(group, {**{f"{metric} mean": history.mean(metric) for metric in metrics},
                                **{f"{metric} {SUPERSEDED}": history.left_branches(metric)[-1] for metric in metrics
                                   if history.left_branches(metric)}}, marks=marks)
              for group, metrics in history.groups().items()]
    error = summary.get("error")
    return (f'<div class="nbtrain-summary">{summary_line(run_name, summary, history)}{"".join(charts)}{table}'
            + debug_hint(run_name, summary)
            + (f'<pre style="color:#d62728">{html.escape(error)}</pre>' if error else "") + "</div>")


def svg_chart(title: str, series: Mapping[str, tuple[Points, Points]],
              width: int = 420, height: int = 240, marks: Sequence[Mark] = ()) -> str:
    margins = left, right, top, bottom = 52, 10, 24, 30
    points = {name: downsample(xs, ys, 400) for name, (xs, ys) in series.items() if len(xs)}
    finite = [(x, y) for xs, ys in points.values() for x, y in zip(xs, ys) if math.isfinite(y)]
    parts = [svg_open(width, height, title, left)]
    if not finite:
        parts.append(f'<text x="{left}" y="{height // 2}">no data</text></svg>')
        return "".join(parts)
    axes = Axes.fitted((p[0] for p in finite), (p[1] for p in finite), width, height, margins)
    sx, sy = axes.sx, axes.sy
    parts.append(axes.frame((f"{axes.x0:g}", f"step {axes.x1:g}")))
    for i, (name, (xs, ys)) in enumerate(points.items()):
        faded = name.endswith(SUPERSEDED)  # the branch a rewind went back from
        colour = "#999999" if faded else COLOURS[i % len(COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys) if math.isfinite(y))
        style = ' stroke-dasharray="5,3" stroke-opacity="0.6"' if faded else ""
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{style} points="{path}"/>')
        parts.append(f'<text x="{width - right - 4}" y="{top + 12 + 12 * i}" text-anchor="end" '
                     f'fill="{colour}">{html.escape(name)}</text>')
    for mark in marks:
        step, label, colour = mark.step, mark.label, style_of(mark).colour
        if axes.x0 <= step <= axes.x1:
            x = sx(step)
            parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="{colour}" '
                         f'stroke-dasharray="3,3"/><text x="{x + 3:.1f}" y="{top + 10}" fill="{colour}" '
                         f'font-size="9">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
