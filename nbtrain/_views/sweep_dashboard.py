"""The live view of a sweep: every trial's curve in one figure, each hyperparameter against the metric,
and the trial table with a button to open a trial's run dashboard or stop it.

It reads the sweep's table with one long poll for all trials (the curves of the
metric are in it), redraws at most every ``REDRAW_INTERVAL_S``, and draws SVG
(a few KB, no JavaScript), so the picture left when the sweep ends is the same
one, and stays in the saved notebook. Outside a notebook it prints a line per change.
"""

from __future__ import annotations

import html
import math
import threading
import time
from typing import Any

from nbtrain._views.dashboard.follower import REDRAW_INTERVAL_S
from nbtrain._views.dashboard.front_end import in_notebook
from nbtrain._views.dashboard.static_plot import COLOURS, Axes, svg_open
from nbtrain._views.dashboard.summary_text import STATE_COLOURS

FADED_OPACITY = 0.25
TERMINAL = ("succeeded", "failed", "stopped")


def show_sweep_dashboard(sweep: Any) -> Any:
    view: SweepDashboard | SweepText = SweepDashboard(sweep) if in_notebook() else SweepText(sweep)
    view.display()
    view.thread = threading.Thread(target=view.follow, name="nbtrain-sweep-view", daemon=True)
    view.thread.start()
    return view


def _colour(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


def rungs(answer: dict[str, Any], options: dict[str, Any] | None = None) -> list[float]:
    """ASHA's rung milestones, drawn as dashed lines (empty for other schedulers)."""
    knobs = options or answer.get("knobs") or {}
    if answer.get("scheduler") != "asha" or not knobs:
        return []
    marks, milestone = [], float(knobs["grace_period"])
    while milestone <= knobs["max_t"]:
        marks.append(milestone)
        milestone *= knobs["reduction_factor"]
    return marks


def curves_svg(answer: dict[str, Any], width: int = 520, height: int = 280) -> str:
    """Every trial's metric per iteration: a colour per trial, stopped and failed trials faded."""
    margins = left, right, top, bottom = 56, 90, 24, 30
    trials = answer.get("trials", [])
    points = [(x, y) for t in trials for x, y in t["curve"] if math.isfinite(y)]
    parts = [svg_open(width, height, f'{answer.get("metric")} per {answer.get("time_attr", "iteration")}, every trial',
                      left, "nbtrain-sweep-curves")]
    if not points:
        return "".join(parts) + f'<text x="{left}" y="{height // 2}">no reports yet</text></svg>'
    axes = Axes.fitted((p[0] for p in points), (p[1] for p in points), width, height, margins)
    sx, sy = axes.sx, axes.sy
    parts.append(axes.frame((f"{axes.x0:g}", f"{axes.x1:g}")))
    for mark in rungs(answer):
        if axes.x0 <= mark <= axes.x1:
            parts.append(f'<line class="rung" x1="{sx(mark):.1f}" y1="{top}" x2="{sx(mark):.1f}" '
                         f'y2="{height - bottom}" stroke="#999" stroke-dasharray="3,3"/>')
    for t in trials:
        line = [(x, y) for x, y in t["curve"] if math.isfinite(y)]
        if not line:
            continue
        faded = t["state"] in ("stopped", "failed")
        style = f'stroke-opacity="{FADED_OPACITY}"' if faded else 'stroke-opacity="1"'
        dash = ' stroke-dasharray="4,2"' if t["state"] == "failed" else ""
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
        parts.append(f'<polyline class="trial trial-{t["state"]}" data-trial="{t["index"]}" fill="none" '
                     f'stroke="{_colour(t["index"])}" stroke-width="1.5" {style}{dash} points="{path}"/>')
        if len(line) == 1:
            parts.append(f'<circle cx="{sx(line[0][0]):.1f}" cy="{sy(line[0][1]):.1f}" r="2.5" '
                         f'fill="{_colour(t["index"])}" {style.replace("stroke-", "fill-")}/>')
    for row, t in enumerate(trials[:16]):
        opacity = FADED_OPACITY * 2 if t["state"] in ("stopped", "failed") else 1
        parts.append(f'<text x="{width - right + 6}" y="{top + 10 + 12 * row}" fill="{_colour(t["index"])}" '
                     f'fill-opacity="{opacity}">trial {t["index"]}</text>')
    return "".join(parts) + "</svg>"


def scatter_svg(answer: dict[str, Any], key: str, width: int = 250, height: int = 200) -> str:
    """One hyperparameter (x) against each trial's best metric (y); log scale over two decades or more."""
    margins = 50, 10, 24, 30
    left = margins[0]
    pairs = [(t["config"].get(key), t["best"], t) for t in answer.get("trials", [])
             if t["best"] is not None and math.isfinite(t["best"])]
    numeric = [(float(x), y, t) for x, y, t in pairs if isinstance(x, (int, float)) and not isinstance(x, bool)]
    parts = [svg_open(width, height, f'best {answer.get("metric")} by {key}', left, "nbtrain-sweep-scatter")]
    if pairs and not numeric:  # categorical: evenly spaced categories
        categories = sorted({str(x) for x, _, _ in pairs})
        numeric = [(float(categories.index(str(x))), y, t) for x, y, t in pairs]
        labels = categories
    else:
        labels = []
    if not numeric:
        return "".join(parts) + f'<text x="{left}" y="{height // 2}">no results yet</text></svg>'
    xs = [x for x, _, _ in numeric]
    log = not labels and min(xs) > 0 and max(xs) / min(xs) >= 100
    xs_t = [math.log10(x) if log else x for x in xs]
    axes = Axes.fitted(xs_t, (y for _, y, _ in numeric), width, height, margins)
    low, high = (labels[0], labels[-1]) if labels else (f"{min(xs):.3g}", f"{max(xs):.3g}")
    parts.append(axes.frame((low, high + (" (log)" if log else "")), y_format=".3g"))
    for (x, y, t), xt in zip(numeric, xs_t):
        opacity = FADED_OPACITY * 2 if t["state"] in ("stopped", "failed") else 1
        parts.append(f'<circle cx="{axes.sx(xt):.1f}" cy="{axes.sy(y):.1f}" r="4" fill="{_colour(t["index"])}" '
                     f'fill-opacity="{opacity}"><title>trial {t["index"]}: {html.escape(key)}={x:g}, '
                     f'{y:.4g}</title></circle>')
    return "".join(parts) + "</svg>"


def header_html(answer: dict[str, Any]) -> str:
    trials = answer.get("trials", [])
    counts = {state: sum(t["state"] == state for t in trials) for state in
              ("pending", "running", "succeeded", "stopped", "failed")}
    state = str(answer.get("state"))
    colour = STATE_COLOURS.get(state, "#333")
    scored = [t for t in trials if t["best"] is not None and t["state"] != "failed"]
    best = (min if answer.get("mode") == "min" else max)(scored, key=lambda t: t["best"]) if scored else None
    best_text = f" · best {answer['metric']} {best['best']:.4g} (trial {best['index']})" if best else ""
    error = f'<div style="color:#b00">{html.escape(str(answer["error"]))}</div>' if answer.get("error") else ""
    waiting = sorted({t["waiting_for"] for t in trials if t["state"] == "pending" and t["waiting_for"]})
    pending = f" · pending trials need {', '.join(waiting)}" if waiting else ""
    return (f'<div class="nbtrain-sweep-header"><b>Sweep {html.escape(str(answer.get("name")))}</b> '
            f'<span style="color:{colour}">{html.escape(state)}</span> · {answer.get("scheduler") or "fifo"}, '
            f'{html.escape(str(answer.get("metric")))} ({answer.get("mode")}) · '
            + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + html.escape(best_text + pending) + error
            + "</div>")


def table_html(answer: dict[str, Any]) -> str:
    keys = list(answer.get("space", {}))
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["trial", *keys, "state", "iterations",
                                                          f"best {answer.get('metric')}", "last", "why"])
    rows = []
    for t in answer.get("trials", []):
        why = t["stop_reason"] or (t["error"] or "")[:160] or (f"pending: needs {t['waiting_for']}"
                                                                if t["state"] == "pending" and t["waiting_for"] else "")
        cells = [f'<span style="color:{_colour(t["index"])}">■</span> {t["index"]}',
                 *[_fmt(t["config"].get(k)) for k in keys], t["state"], str(t["iterations"]),
                 _fmt(t["best"]), _fmt(t["last"]), why]
        faded = ' style="opacity:0.55"' if t["state"] in ("stopped", "failed") else ""
        rows.append(f'<tr class="trial-row trial-{t["state"]}"{faded}>' +
                    "".join(f"<td>{html.escape(c) if i else c}</td>" for i, c in enumerate(cells)) + "</tr>")
    return (f'<table class="nbtrain-sweep-trials" style="border-collapse:collapse;font-size:12px">'
            f'<tr>{head}</tr>{"".join(rows)}</table>')


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class SweepDashboard:
    """ipywidgets: header, the figures, the trial table, a trial picker (open its run / stop it), Stop."""

    def __init__(self, sweep: Any) -> None:
        import ipywidgets as w

        self.sweep = sweep
        self.thread: threading.Thread | None = None
        self.header = w.HTML()
        self.curves = w.HTML()
        self.scatters = w.HTML()
        self.table = w.HTML()
        self.picker = w.Dropdown(description="trial:", options=[], layout=w.Layout(width="220px"))
        self.open_button = w.Button(description="Open its run", icon="line-chart",
                                    tooltip="Show the picked trial's run dashboard below")
        self.stop_trial_button = w.Button(description="Stop trial", icon="stop", tooltip="Stop the picked trial")
        self.stop_button = w.Button(description="Stop sweep", icon="stop", button_style="danger",
                                    tooltip="Stop every trial and end the sweep")
        self.run_view = w.Output()
        self.open_button.on_click(lambda _b: self._open_trial())
        self.stop_trial_button.on_click(lambda _b: self._stop_trial())
        self.stop_button.on_click(lambda _b: threading.Thread(target=self.sweep.stop, daemon=True).start())
        self.widget = w.VBox([self.header, w.HBox([self.curves, self.scatters], layout=w.Layout(flex_flow="row wrap")),
                              self.table, w.HBox([self.picker, self.open_button, self.stop_trial_button,
                                                  self.stop_button]), self.run_view])
        self.widget.add_class("nbtrain-sweep-dashboard")
        self._static: Any = None

    def _ipython_display_(self) -> None:
        """Shown once already (``sweep.dashboard()`` displays it): as a cell's last value it adds nothing."""

    def display(self) -> None:
        """One output: the live widget, its static picture the fallback where widgets do not render."""
        from IPython.display import display

        from nbtrain._views.dashboard.front_end import DashboardOutput

        fallback = (f'<div class="nbtrain-sweep-summary">Sweep <b>{html.escape(str(self.sweep.name))}</b>: its '
                    "live dashboard is a widget; this front end does not show widgets.</div>")
        self._static = display(DashboardOutput(self.widget, fallback), display_id=True)

    def draw(self, answer: dict[str, Any]) -> None:
        self.header.value = header_html(answer)
        self.curves.value = curves_svg(answer)
        self.scatters.value = "".join(scatter_svg(answer, key) for key in answer.get("space", {}))
        self.table.value = table_html(answer)
        choices = [(f"trial {t['index']} ({t['state']})", t["index"]) for t in answer.get("trials", [])]
        if [c[1] for c in choices] != [c[1] for c in self.picker.options] or choices != list(self.picker.options):
            picked = self.picker.value
            self.picker.options = choices
            if picked in [c[1] for c in choices]:
                self.picker.value = picked
        ended = answer.get("state") in TERMINAL
        self.stop_button.disabled = ended
        self.stop_trial_button.disabled = ended

    def _open_trial(self) -> None:
        index = self.picker.value
        trial = next((t for t in self.sweep.trials if t.index == index), None)
        self.run_view.clear_output()
        with self.run_view:
            if trial is None or trial.run_name is None:
                print(f"trial {index} has not started yet: it has no run to show.")
                return
            trial.run.dashboard()

    def _stop_trial(self) -> None:
        if self.picker.value is not None:
            self.sweep.stop_trial(self.picker.value)

    def follow(self) -> None:
        drawn = 0.0
        answer = self.sweep.cached or self.sweep.refresh()
        self.draw(answer)
        while answer.get("state") not in TERMINAL:
            try:
                answer = self.sweep.refresh(wait_s=5.0)
            except Exception as exc:  # noqa: BLE001 - the view says why it stopped following, the sweep goes on
                self.header.value += f'<div style="color:#b00">Lost the sweep: {html.escape(str(exc))}</div>'
                return
            if time.monotonic() - drawn >= REDRAW_INTERVAL_S or answer.get("state") in TERMINAL:
                self.draw(answer)
                drawn = time.monotonic()
        self._leave_static(answer)

    def _leave_static(self, answer: dict[str, Any]) -> None:
        from nbtrain._views.dashboard.front_end import DashboardOutput

        if self._static is not None:
            self._static.update(DashboardOutput(self.widget, (
                '<div class="nbtrain-sweep-summary">' + header_html(answer) + curves_svg(answer)
                + "".join(scatter_svg(answer, key) for key in answer.get("space", {})) + table_html(answer)
                + "</div>")))


class SweepText:
    """Outside a notebook: one line whenever the trial counts or the best value change."""

    def __init__(self, sweep: Any) -> None:
        self.sweep = sweep
        self.thread: threading.Thread | None = None

    def display(self) -> None:
        pass

    def follow(self) -> None:
        said = ""
        answer = self.sweep.cached or self.sweep.refresh()
        while True:
            line = html.unescape(_strip_tags(header_html(answer)))
            if line != said:
                print(line, flush=True)
                said = line
            if answer.get("state") in TERMINAL:
                return
            answer = self.sweep.refresh(wait_s=5.0)


def _strip_tags(text: str) -> str:
    import re

    return re.sub(r"<[^>]+>", "", text)
