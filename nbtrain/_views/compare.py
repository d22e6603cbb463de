"""``nbtrain.compare()``: several runs' curves on one plot, with their config differences and final metrics.

Each run is drawn as its ranks' mean of one metric, by step or by time since it started, as its history model
says it (:class:`~nbtrain._client.run.run_history.RunHistory`: the rows a rewind left or a later attempt
replaced do not count). ``figure()`` gives the same curves as a plotly figure. A forked run
(``run.fork()``) is drawn from its fork step on: its rows are numbered from the parent's checkpoint
when its code continues the parent's steps, and shifted there when its steps start again from 0. The
comparison follows live runs: while any of them goes on, a thread of its own refreshes it every
:data:`FOLLOW_S` seconds, and stops once all have ended (or ``close()``).

Shown in a notebook it is one output: the charts widget draws the runs (a thick line each, points for a run
reported far more rarely than the others, no line across a gap in a run's reports), the static SVG of the same
chart is the fallback where widgets do not render, and once every run has ended the widget keeps its final
picture (a bounded snapshot) for a notebook saved with widget state.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nbtrain._exceptions import InvalidOptionError
from nbtrain._registry import is_whole
from nbtrain._states import RunState

if TYPE_CHECKING:
    from nbtrain._views.dashboard.chart import Chart

FOLLOW_S = 2.0
X_CHOICES = ("step", "time")


def compare(runs: Iterable[Any], metric: str = "loss", *, x: str = "step") -> Comparison:
    """Draw several runs on one plot of ``metric`` (each run's mean over its ranks), with a table of how
    their configs differ and each run's final ``metric``: to see what a fork or a changed setting did.
    Shown in a notebook, it follows live runs until they end.

    Args:
        runs: :class:`Run` objects or run names.
        metric: the metric to plot, as the runs report it.
        x: ``"step"``, or ``"time"`` (seconds since each run's first report).

    Returns:
        The comparison, which shows itself in a notebook; its ``curves()`` and ``table()`` are the data.

    Raises:
        InvalidOptionError: no runs, or ``metric`` or ``x`` is not one it takes.
        RunNotFoundError: a name is not a run on the connected cluster.
        NotConnectedError: a name was given without ``connect()`` first.

    Example::

        child = run.fork(config={"lr": 0.01})
        nbtrain.compare([run, child], metric="loss")
    """
    from nbtrain._client.entry.launch import attach

    if x not in X_CHOICES:
        raise InvalidOptionError(f"compare(x=...) is 'step' or 'time', not {x!r}.")
    if not isinstance(metric, str) or not metric:
        raise InvalidOptionError(f"compare(metric=...) is a metric's name, like 'loss', not {metric!r}.")
    if isinstance(runs, str):  # one name, not the names of its letters
        runs = [runs]
    chosen = [attach(run) if isinstance(run, str) else run for run in runs]  # an unknown name: attach says so
    if len(chosen) < 1:
        raise InvalidOptionError("compare() needs at least one run (or run name).")
    _check_metric(chosen, metric)
    return Comparison(chosen, metric, x)


def _check_metric(runs: list[Any], metric: str) -> None:
    """Refuse a metric that no run reports, once every run has reported something (a run that has not yet
    may still report it: the comparison follows it)."""
    reported = [set(run.summary().get("latest") or {}) for run in runs]
    if all(reported) and not any(metric in keys for keys in reported):
        known = ", ".join(repr(key) for key in sorted(set().union(*reported)))
        raise InvalidOptionError(f"compare(metric={metric!r}): none of the runs reports {metric!r}; they report "
                                 f"{known}. Give one of those.")


class Comparison:
    """What ``compare()`` returns: shows itself in a notebook; ``curves()`` and ``table()`` are the data."""

    def __init__(self, runs: list[Any], metric: str, x: str) -> None:
        self.runs, self.metric, self.x = runs, metric, x
        self._widget: Any = None
        self._static: Any = None   # the display that holds the static picture once every run has ended
        self._stop = threading.Event()

    # ------------------------------------------------------------------ the data
    def curves(self) -> dict[str, tuple[list[float], list[float]]]:
        """The plotted data: each run's metric by step or time, averaged over its ranks.

        A forked run starts at its fork step, so it continues its parent's curve.

        Returns:
            ``{run name: (xs, ys)}``; ``xs`` are steps, or seconds since the run's first report with
            ``x="time"``; a run that has not reported the metric has two empty lists.

        Example::

            xs, ys = nbtrain.compare([run, child]).curves()[child.name]
        """
        found = {}
        for run in self.runs:
            history = run.reader.history()
            steps, means = history.mean(self.metric)
            if self.x == "step":
                xs = steps + _fork_shift(history.summary, steps)
            else:
                _steps, first = history.first_times(self.metric)
                xs = first - first.min() if len(first) else first
            found[run.name] = (xs.astype(float).tolist(), means.astype(float).tolist())
        return found

    def figure(self) -> Any:
        """The comparison as a plotly figure: one trace per run (its mean across ranks, downsampled as the
        dashboard's curves are), the legend right of the plot, no line drawn across a gap in a run's reports.

        Returns:
            A ``plotly.graph_objects.Figure`` (no run reported the metric yet: an empty one whose title says so).

        Example::

            nbtrain.compare([run, child], metric="val_loss").figure().write_html("compare.html")
        """
        from nbtrain._views.figures import comparison_figure

        curves = {name: curve for name, curve in self.curves().items() if curve[0]}
        return comparison_figure(f"{self.metric} by {self.x}: {', '.join(run.name for run in self.runs)}", curves,
                                 xlabel="step" if self.x == "step" else "seconds since the first report")

    def table(self) -> list[dict[str, Any]]:
        """The table under the plot: how the runs differ and how they did.

        Returns:
            One dict per run, with ``run``, ``state``, ``forked from`` (``"<parent> @ <step>"`` or ``""``), each
            config value that differs between the runs, and ``final <metric>`` and ``best <metric>`` (the
            lowest; ``None`` before any report).

        Example::

            pandas.DataFrame(nbtrain.compare(["lr-0.1", "lr-0.01"]).table())
        """
        configs = {run.name: dict(run.config) for run in self.runs}
        keys = sorted({key for config in configs.values() for key in config})
        differing = [key for key in keys if len({repr(config.get(key)) for config in configs.values()}) > 1]
        curves = self.curves()
        rows = []
        for run in self.runs:
            summary = run.summary()
            parent = summary.get("parent")
            ys = curves[run.name][1]
            rows.append({"run": run.name, "state": summary["state"],
                         "forked from": f"{parent['run']} @ {parent['step']}" if parent else "",
                         **{key: configs[run.name].get(key) for key in differing},
                         f"final {self.metric}": ys[-1] if ys else None,
                         f"best {self.metric}": min(ys) if ys else None})
        return rows

    # ------------------------------------------------------------------ showing it
    def _ipython_display_(self) -> None:
        from IPython.display import display

        from nbtrain._views.dashboard.front_end import DashboardOutput

        self._build()
        ended = self._all_ended()
        if ended:
            self._charts.freeze()
        # one output: the live plot and table, and the static picture for front ends without widgets
        self._static = display(DashboardOutput(self._widget, self._picture()), display_id=True)
        if not ended:
            threading.Thread(target=self._follow, name="nbtrain-compare", daemon=True).start()

    def _chart(self) -> Chart:
        """What is drawn, live and static: one trace per run (:func:`~nbtrain._views.dashboard.chart.series`)."""
        from nbtrain._views.dashboard.chart import MEAN_WIDTH, Chart, colour_of, series

        traces = series([(name, xs, ys, {"colour": colour_of(index), "width": MEAN_WIDTH})
                         for index, (name, (xs, ys)) in enumerate(self.curves().items())])
        return Chart("compare", f"{self.metric} by {self.x}", traces,
                     xlabel="step" if self.x == "step" else "seconds")

    def _picture(self) -> str:
        """The comparison as static HTML (an SVG and the table): what a saved notebook shows without widgets."""
        from nbtrain._views.dashboard.static_plot import svg_chart

        return f'<div class="nbtrain-compare-summary">{svg_chart(self._chart(), width=640, height=300)}' \
               f"{_html_table(self.table())}</div>"

    def _leave_static(self) -> None:
        """Once every run has ended: the output's static fallback shows the final picture."""
        from nbtrain._views.dashboard.front_end import DashboardOutput

        if self._static is not None:
            self._static.update(DashboardOutput(self._widget, self._picture()))

    def __repr__(self) -> str:
        lines = [f"compare({[run.name for run in self.runs]}, metric={self.metric!r}, x={self.x!r})"]
        for row in self.table():
            lines.append("  " + ", ".join(f"{key}={value}" for key, value in row.items()))
        return "\n".join(lines)

    def close(self) -> None:
        """Stop following the live runs: the plot and the table keep what they show now. The runs go on."""
        self._stop.set()

    def _build(self) -> None:
        import ipywidgets as w

        from nbtrain._views.dashboard.charts_widget import ChartsWidget

        self._charts, self._table = ChartsWidget(), w.HTML()
        self._widget = w.VBox([self._charts, self._table])
        self._widget.add_class("nbtrain-compare")
        self._draw()

    def _draw(self) -> None:
        self._charts.draw(self._chart())
        self._table.value = f'<div class="nbtrain-compare-summary">{_html_table(self.table())}</div>'

    def _follow(self) -> None:
        while not self._stop.wait(FOLLOW_S):
            try:
                self._draw()
            except Exception:  # noqa: BLE001 - a run deleted meanwhile: stop following, keep what is drawn
                return
            if self._all_ended():
                self._draw()
                self._charts.freeze()
                self._leave_static()
                return

    def _all_ended(self) -> bool:
        return all(RunState(run.summary()["state"]).is_terminal for run in self.runs)


def _fork_shift(summary: Mapping[str, Any], steps: Any) -> int:
    parent = summary.get("parent")
    if not parent or not len(steps):
        return 0
    return int(parent["step"]) if steps[0] < int(parent["step"]) else 0


def _html_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(str(key))}</th>" for key in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_shown(value))}</td>" for value in row.values()) + "</tr>"
                   for row in rows)
    return f'<table class="nbtrain-compare-table"><tr>{head}</tr>{body}</table>'


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def sweep_figure(sweep: Any, best: int = 3) -> Any:
    """``sweep.figure(best)``: the best trials' curves of the sweep's metric, best first (failed trials left out)."""
    from nbtrain._views.figures import comparison_figure

    if not is_whole(best) or best < 1:
        raise InvalidOptionError(f"sweep.figure(best=...) is how many trials to draw, a whole number >= 1; "
                                 f"got {best!r}.")
    trials = sweep.trials
    answer = sweep.cached
    metric, mode = answer.get("metric"), answer.get("mode")
    scored = [t for t in trials if t.best is not None and t.state != "failed" and t.run_name is not None]
    picked = sorted(scored, key=lambda t: t.best, reverse=mode == "max")[:best]
    title = f"sweep {sweep.name}: best {len(picked)} of {len(trials)} trials by {metric} ({mode})"
    if not picked:
        return comparison_figure(title, {})
    curves = Comparison([t.run for t in picked], str(metric), "step").curves()
    named = {f"trial {t.index}: {_config_said(t.config)}": curves[t.run_name] for t in picked if t.run_name in curves}
    return comparison_figure(title, {name: curve for name, curve in named.items() if curve[0]})


def _config_said(config: Mapping[str, Any], chars: int = 60) -> str:
    said = ", ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in config.items())
    return said if len(said) <= chars else said[:chars - 1] + "…"
