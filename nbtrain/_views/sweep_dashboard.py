"""The live view of a sweep: every trial's curve in one chart, each hyperparameter against the metric,
and the trial table with a button to open a trial's run dashboard or stop it.

It reads the sweep's table with one long poll for all trials (the curves of the metric are in it) and redraws
at most every ``REDRAW_INTERVAL_S``. The trials' curves are a :class:`~nbtrain._views.dashboard.chart.Chart`
that the charts widget draws live (a trace per trial, stopped and failed trials faded, ASHA's rungs as marks)
and the static SVG draws for the output's fallback; when the sweep ends the widget keeps its final picture (a
bounded snapshot of at most ``MAX_TRIALS_DRAWN`` trials) for a notebook saved with widget state. The scatter
plots are small static SVG. Outside a notebook it prints a line per change.
"""

from __future__ import annotations

import html
import math
import threading
import time
from typing import Any

from nbtrain._client.run.run_history import Mark
from nbtrain._views.dashboard.chart import FADED_OPACITY, Chart, colour_of, series
from nbtrain._views.dashboard.follower import REDRAW_INTERVAL_S
from nbtrain._views.dashboard.front_end import in_notebook
from nbtrain._views.dashboard.mark_styles import RUNG
from nbtrain._views.dashboard.static_plot import Dot, svg_chart, svg_scatter
from nbtrain._views.dashboard.summary_text import STATE_COLOURS

TERMINAL = ("succeeded", "failed", "stopped")
CUT = ("stopped", "failed")     # trials drawn faded
MAX_TRIALS_DRAWN = 50           # trials with a curve beyond this: the unfinished ones and the best are drawn
TRIAL_POINTS = 500              # per trial's curve
TRIAL_WIDTH = 2.0


def show_sweep_dashboard(sweep: Any) -> Any:
    view: SweepDashboard | SweepText = SweepDashboard(sweep) if in_notebook() else SweepText(sweep)
    view.display()
    view.thread = threading.Thread(target=view.follow, name="nbtrain-sweep-view", daemon=True)
    view.thread.start()
    return view


def rungs(answer: dict[str, Any], options: dict[str, Any] | None = None) -> list[Mark]:
    """ASHA's rungs (0: the grace period), marked where trials below the best fraction are stopped (none for
    other schedulers)."""
    knobs = options or answer.get("knobs") or {}
    if answer.get("scheduler") != "asha" or not knobs:
        return []
    marks: list[Mark] = []
    milestone = float(knobs["grace_period"])
    while milestone <= knobs["max_t"]:
        marks.append(Mark(milestone, RUNG, f"rung {len(marks)}"))
        milestone *= knobs["reduction_factor"]
    return marks


def drawn_trials(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials with a curve, in their order; beyond ``MAX_TRIALS_DRAWN`` of them, the unfinished ones and then
    the best of the others."""
    trials = [t for t in answer.get("trials", []) if any(math.isfinite(y) for _x, y in t["curve"])]
    if len(trials) <= MAX_TRIALS_DRAWN:
        return trials
    going = [t for t in trials if t["state"] not in TERMINAL]
    ended = sorted((t for t in trials if t["state"] in TERMINAL and t["best"] is not None),
                   key=lambda t: t["best"], reverse=answer.get("mode") == "max")
    kept = {t["index"] for t in [*going, *ended][:MAX_TRIALS_DRAWN]}
    return [t for t in trials if t["index"] in kept]


def trials_chart(answer: dict[str, Any]) -> Chart:
    """Every trial's metric per iteration (live and static alike): a colour per trial, stopped and failed trials
    faded (failed ones dashed), ASHA's rungs marked."""
    trials = drawn_trials(answer)
    total = sum(1 for t in answer.get("trials", []) if t["curve"])
    which = "every trial" if len(trials) == total else f"{len(trials)} of {total} trials (the unfinished and the best)"
    traces = series([(f"trial {t['index']}", [x for x, _y in t["curve"]], [y for _x, y in t["curve"]],
                      {"colour": colour_of(t["index"]), "width": TRIAL_WIDTH,
                       "opacity": FADED_OPACITY if t["state"] in CUT else 1.0, "dash": t["state"] == "failed",
                       "breaks": t.get("breaks", ())})
                     for t in trials], TRIAL_POINTS)
    time_attr = answer.get("time_attr", "iteration")
    return Chart("trials", f"{answer.get('metric')} per {time_attr}, {which}", traces, rungs(answer), time_attr)


def scatters_html(answer: dict[str, Any]) -> str:
    """Each hyperparameter against each trial's best metric (log scale over two decades or more)."""
    return "".join(scatter_svg(answer, key) for key in answer.get("space", {}))


def scatter_svg(answer: dict[str, Any], key: str) -> str:
    dots = [Dot(t["config"].get(key), t["best"], colour_of(t["index"]),
             FADED_OPACITY * 2 if t["state"] in CUT else 1.0,
             f"trial {t['index']}: {key}={_fmt(t['config'].get(key))}, {t['best']:.4g}")
            for t in answer.get("trials", []) if t["best"] is not None and math.isfinite(t["best"])]
    return svg_scatter(f"best {answer.get('metric')} by {key}", dots)


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
        cells = [f'<span style="color:{colour_of(t["index"])}">■</span> {t["index"]}',
                 *[_fmt(t["config"].get(k)) for k in keys], t["state"], str(t["iterations"]),
                 _fmt(t["best"]), _fmt(t["last"]), why]
        faded = ' style="opacity:0.55"' if t["state"] in CUT else ""
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

        from nbtrain._views.dashboard.charts_widget import ChartsWidget

        self.sweep = sweep
        self.thread: threading.Thread | None = None
        self.header = w.HTML()
        self.curves = ChartsWidget()
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
        self.curves.draw(trials_chart(answer))
        self.scatters.value = scatters_html(answer)
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
        self.curves.freeze()
        self._leave_static(answer)

    def _leave_static(self, answer: dict[str, Any]) -> None:
        from nbtrain._views.dashboard.front_end import DashboardOutput

        if self._static is not None:
            self._static.update(DashboardOutput(self.widget, (
                '<div class="nbtrain-sweep-summary">' + header_html(answer) + svg_chart(trials_chart(answer))
                + scatters_html(answer) + table_html(answer) + "</div>")))


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
