"""The live view of a run: widgets in a notebook, one text line elsewhere.

Both read the same :class:`~nbtrain.Run` through its cursor, followed by
:mod:`~nbtrain._views.dashboard.follower`; redraws are coalesced (at most one every
``REDRAW_INTERVAL_S``, a held-back one drawn when due), widgets are updated in
place (never re-displayed), curves are downsampled before they reach the
browser, worker logs go to collapsed per-rank panes rather than the cell's
output, and a failed run turns red and stays red. The dashboard is one output: the widget, with a
static SVG + text summary as its fallback for front ends that show no widgets; when the run ends the
summary line is drawn in the widget too.

A wide run (more than ``WIDE_RANKS`` ranks) is drawn as the mean across ranks
with a min-max band, plus lines for the ranks the user picks (``ranks=`` or the
"ranks:" box); its worker table is a summary by node and state and pages of
``RANKS_PER_PAGE`` ranks. Ranks that lag the median step of the running ranks
are listed in the header and marked in the table, whatever the width.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from nbtrain._client.run.run_history import Mark, marks_of
from nbtrain._states import RunState
from nbtrain._views.dashboard.chart import (
    BRANCH_COLOUR,
    BRANCH_OPACITY,
    BRANCH_WIDTH,
    MEAN_COLOUR,
    MEAN_WIDTH,
    RANK_OPACITY,
    RANK_WIDTH,
    Chart,
    Trace,
    colour_of,
)
from nbtrain._views.dashboard.controls import Controls
from nbtrain._views.dashboard.dashboard_widget import DashboardWidget
from nbtrain._views.dashboard.follower import REDRAW_INTERVAL_S, STRAGGLERS_LISTED, Follower, TextProgress
from nbtrain._views.dashboard.front_end import (
    DashboardOutput,
    background_thread,
    execution_count,
    in_marimo,
    in_notebook,
    marimo_output,
    running_cell,
)
from nbtrain._views.dashboard.history import MetricHistory, take_new_rows
from nbtrain._views.dashboard.log_panes import LogPanes
from nbtrain._views.dashboard.static_plot import static_summary, summary_line
from nbtrain._views.dashboard.step_time_plot import debug_hint, draw_step_times
from nbtrain._views.dashboard.summary_text import (
    STATE_COLOURS,
    config_text,
    elapsed,
    fmt_duration,
    indeterminate_bar,
    parent_note,
    progress_fraction,
    state_label,
)
from nbtrain._views.dashboard.workers_view import (
    RANKS_PER_PAGE,
    parse_ranks,
    stragglers,
    summary_table,
    worker_table,
)

MAX_POINTS_PER_TRACE = 2000
WIDE_RANKS = 8               # above this many ranks: a band across ranks, a summarised and paged worker table


def show_dashboard(run: Any, *, follow: str = "background", ranks: Iterable[int] = ()) -> Any:
    """Show ``run`` live. ``follow``: "background" (a thread redraws), "none" (the caller calls ``update``).

    ``ranks``: in a wide run, the ranks drawn as lines of their own besides the band
    (``run.dashboard(ranks=[0, 17, 200])``); the "ranks:" box changes them later.
    """
    view: Any = WidgetDashboard(run, ranks=ranks) if in_marimo() or in_notebook() else TextProgress(run)
    try:  # drawn before it is shown: what the run has (all of it, when it ended) is on the page from the start
        view.update()
    except Exception as exc:  # noqa: BLE001 - the follower retries; the view says why it is empty meanwhile
        view.note_problem(f"Could not read the run yet ({exc}); retrying…")
    view.display()
    if follow == "background":
        key = (running_cell(), run.name)
        earlier = _FOLLOWING.pop(key, None)
        if earlier is not None:  # the same cell run again: one long poll for it, not one per run of the cell
            earlier.close()
        _FOLLOWING[key] = view
        run.reader.add_view(view)
        view.follow_in_background()
    return view


# The live views, by (the cell that shows it, the run): running a dashboard cell again closes the one
# it showed before. Outside JupyterLab and Notebook 7 (no cell ids) the key is the run alone.
_FOLLOWING: dict[tuple[str | None, str], Any] = {}


class WidgetDashboard(Follower):
    """One widget of our own (:class:`~.dashboard_widget.DashboardWidget`: header, progress, charts, worker table,
    step times, logs, controls), shown as one output whose static fallback is the summary
    (:class:`DashboardOutput`); the same widget in every front end, marimo included.

    ``widget``: the model to draw in (tests hand one that records what it would send); ``start(call)``: runs a
    control's call off the kernel's widget-message thread (by default a daemon thread of its own).
    """

    def __init__(self, run: Any, ranks: Iterable[int] = (), widget: DashboardWidget | None = None,
                 start: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.run = run
        # its log panes show each failing rank's traceback, so a blocking cell need not print them again
        self.shows_tracebacks = True
        self.history = MetricHistory()
        self.chosen_ranks = sorted(set(ranks))
        self.wide = False
        self.page = 0
        self._summary: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._drawn_rows = -1
        self._drawn_at = 0.0        # monotonic time of the last redraw
        self._undrawn = False       # rows or a summary taken since then, waiting for the throttle
        self._finished = False
        self._static_handle: Any = None
        self._shown_in: int | None = None  # the execution count of the cell that displayed it
        self._table = ""            # the worker table's HTML as drawn: the static summary's too
        self._ranks_error = ""
        self.widget = widget if widget is not None else DashboardWidget()
        self.widget.on_action = self.act
        self.logs = LogPanes(self.widget)
        self.controls = Controls(run, self.note_problem, self._publish_controls, start or self._start)
        self._draw_ranks()

    # ------------------------------------------------------------------ display
    def display(self) -> None:
        """Show the dashboard: one output, the live widget with the summary as its static fallback. (marimo
        shows what the cell returns: :meth:`_display_`.)"""
        from IPython.display import display

        if in_marimo():
            self._shown_in = execution_count()
            return
        fallback = self._fallback(self._summary if self._finished else None)
        self._static_handle = display(DashboardOutput(self.widget, fallback), display_id=True)
        self._shown_in = execution_count()

    def _ipython_display_(self) -> None:
        # `run.dashboard()` as a cell's last line: IPython displays the returned view too; it was shown already
        if self._static_handle is None or self._shown_in != execution_count():
            self.display()

    def _display_(self) -> Any:
        """marimo's display protocol: the same widget, through ``marimo.ui.anywidget``."""
        return marimo_output(self.widget)

    def _fallback(self, summary: dict[str, Any] | None = None) -> str:
        """The text/html of the dashboard's output: where widgets do not render, the run's name and state;
        once it ended, its static summary."""
        if summary is None:
            return (f'<div class="nbtrain-summary nbtrain-live-fallback">Run <b>{html.escape(self.run.name)}</b>: '
                    f"its live dashboard is a widget; this front end does not show widgets.</div>")
        return static_summary(self.run.name, summary, self.history, self.curve_charts(ranks=False), self._table)

    # ------------------------------------------------------------------ what the page asks
    def act(self, message: dict[str, Any]) -> None:
        """A message from the page (:mod:`.dashboard_widget`): the view's own (the ranks box, the pager) here,
        the run's controls (:class:`~.controls.Controls`) theirs. Called on the kernel's widget-message thread."""
        view_action = VIEW_ACTIONS.get(str(message.get("action")))
        if view_action is not None:
            view_action(self, message)
        else:
            self.controls.act(message)

    def _choose_ranks(self, message: dict[str, Any]) -> None:
        try:
            ranks = parse_ranks(str(message.get("value", "")))
        except ValueError as exc:
            self._ranks_error = str(exc)
            self._draw_ranks()
            return
        with self._lock:
            self._ranks_error = ""
            self.chosen_ranks = ranks
            self._draw_ranks()
            self._draw_curves()

    def _turn_page(self, message: dict[str, Any]) -> None:
        with self._lock:
            self.page += int(message.get("by") or 0)
            self._draw_workers(self._summary)

    def _start(self, target: Callable[[], None]) -> None:
        background_thread(target, f"nbtrain-control-{self.run.name}").start()

    def note_problem(self, message: str, colour: str = "#d62728") -> None:
        self.widget.notice = {"text": message, "colour": colour}

    def _publish_controls(self) -> None:
        with self._lock:
            self.widget.controls = self.controls.state(self._summary)
            self.widget.answer = self.controls.answer

    # ------------------------------------------------------------------ drawing
    def draw_due_in(self) -> float | None:
        return REDRAW_INTERVAL_S - (time.monotonic() - self._drawn_at) if self._undrawn else None

    def update(self, wait_s: float = 0.0, coalesce: bool = False) -> bool:
        self.run.reader.refresh(wait_s=wait_s)  # outside the lock: a long poll must not block Stop's redraw
        with self._lock:
            # by position in the Run's history, not refresh()'s return value: rows a cell's
            # run.metrics fetched in the meantime are drawn too
            take_new_rows(self.run, self.history)
            summary = self.run.reader.summary
            self._summary = summary
            wide = max(summary.get("world_size") or 0, len(self.history.ranks())) > WIDE_RANKS
            if wide != self.wide:
                self.wide, self._drawn_rows = wide, -1
                self._draw_ranks()
            # ended, and every row is here: a long history's last pages come after the final state
            terminal = RunState(summary["state"]).is_terminal and self.run.reader.caught_up
            now = time.monotonic()
            if coalesce and not terminal and now - self._drawn_at < REDRAW_INTERVAL_S:
                self._undrawn = True  # drawn when due: redraws stay at a few per second
                return False
            self._drawn_at, self._undrawn = now, False
            self._draw_header(summary)
            self._publish_controls()
            if self.history.rows_seen != self._drawn_rows:
                self._draw_curves()
                self._drawn_rows = self.history.rows_seen
            self._draw_workers(summary)
            self.logs.draw(self.run.reader, summary)
            self._draw_notice()
            if terminal and not self._finished:
                self._finished = True
                self.widget.freeze(self.logs.failing)
                self._leave_static_summary(summary)
            return terminal

    def _draw_ranks(self) -> None:
        self.widget.ranks = {"shown": self.wide, "value": ", ".join(map(str, self.chosen_ranks)),
                             "error": self._ranks_error}

    def _draw_header(self, summary: dict[str, Any]) -> None:
        state = summary["state"]
        colour = STATE_COLOURS.get(state, "#777")
        label = state_label(summary)
        badge = (f'<span class="nbtrain-state" data-state="{state}" style="background:{colour};color:white;'
                 f'padding:2px 8px;border-radius:10px">{html.escape(label)}</span>')
        config, cut = config_text(summary)
        whole = (' <span class="nbtrain-config-more" style="opacity:0.7">(the whole config: '
                 '<code>run.config</code>)</span>') if cut else ""
        self.widget.header = (f'<b style="font-size:1.1em">{html.escape(self.run.name)}</b> {badge} '
                              f'<span class="nbtrain-elapsed">{fmt_duration(elapsed(summary))}</span> · '
                              f'{summary.get("world_size")} workers'
                              + self._straggler_note(summary)
                              + parent_note(summary.get("parent"))
                              + (f' · <code class="nbtrain-config">{html.escape(config)}</code>{whole}'
                                if config else "")
                              + (' · <span class="nbtrain-modules" title="the notebook\'s own modules, sent with the '
                                'run (name@content hash)">modules sent: '
                                + html.escape(", ".join(summary["modules"])) + "</span>"
                                if summary.get("modules") else ""))
        fraction = progress_fraction(summary)
        seconds = elapsed(summary)
        counted = "".join(f" · {name} {value}" for name, value in self.history.counters.items())
        style = {"failed": "danger", "succeeded": "success", "stopped": "warning"}.get(state, "")
        if fraction is not None:
            eta = seconds / fraction * (1 - fraction) if fraction > 0 and state == "running" else None
            label = f" {fraction:.0%}" + (f" · ETA {fmt_duration(eta)}" if eta else "") + counted
        elif RunState(state).is_terminal:
            fraction = 1.0  # a full bar in the state's colour (red stays red)
            label = f" step {summary.get('step', 0)}{counted} · {fmt_duration(seconds)}"
        else:  # no total_steps: how far and how long, and a bar that says it is going
            label = f"{indeterminate_bar(seconds)} step {summary.get('step', 0)}{counted} · {fmt_duration(seconds)}"
        self.widget.progress = {"fraction": fraction, "style": style, "label": label}

    def _straggler_note(self, summary: dict[str, Any]) -> str:
        late = stragglers(summary.get("workers") or [])
        if not late:
            return ""
        listed = ", ".join(map(str, late[:STRAGGLERS_LISTED])) + (
            f" and {len(late) - STRAGGLERS_LISTED} more" if len(late) > STRAGGLERS_LISTED else "")
        return (f' · <span class="nbtrain-stragglers" style="color:#ff7f0e" title="ranks whose step lags the '
                f'median step of the running ranks">straggler{"s" if len(late) > 1 else ""}: rank'
                f'{"s" if len(late) > 1 else ""} {listed}</span>')

    def curve_traces(self, metrics: list[str], ranks: bool = True) -> list[Trace]:
        """One chart's traces: per-rank lines (thin, translucent) and the mean (thick), or in a wide run the mean,
        its min-max band and the chosen ranks' lines; the branches rewinds left, faded. One metric: a colour per
        rank and a dark mean; several (loss, val_loss): a colour per metric. A metric reported far more rarely
        than the others (``epoch_loss`` beside ``loss``) is points; lines break across gaps in the reports.
        ``ranks=False``: no rank's own line (the static picture's)."""
        traces: list[Trace] = []
        alone = len(metrics) == 1
        history = self.history
        for index, metric in enumerate(metrics):
            tint, points = colour_of(index), history.sparse(metric)
            traces += [Trace(f"{metric} superseded {number}", xs, ys, BRANCH_COLOUR, BRANCH_WIDTH, BRANCH_OPACITY,
                             dash=True, points=points, breaks=breaks)
                       for number, (xs, ys, breaks) in enumerate(history.left_branches(metric), 1)]
            steps, mean, low, high = history.band(metric)
            breaks = history.band_breaks(metric)
            if not self.wide:
                for rank in history.ranks(metric) if ranks else []:
                    xs, ys = history.points(metric, rank, MAX_POINTS_PER_TRACE)
                    traces.append(Trace(f"{metric} rank {rank}", xs, ys, colour_of(rank) if alone else tint, RANK_WIDTH,
                                        RANK_OPACITY, points=points, breaks=history.rank_breaks(metric, rank)))
                traces.append(Trace(f"{metric} mean", steps, mean, MEAN_COLOUR if alone else tint, MEAN_WIDTH,
                                    points=points, breaks=breaks))
                continue
            traces.append(Trace(f"{metric} min across ranks", steps, low, tint, band="low", breaks=breaks))
            traces.append(Trace(f"{metric} min–max across ranks", steps, high, tint, band="high", breaks=breaks))
            traces.append(Trace(f"{metric} mean", steps, mean, tint, MEAN_WIDTH, points=points, breaks=breaks))
            for number, rank in enumerate(self.chosen_ranks if ranks else []):
                xs, ys = history.points(metric, rank, MAX_POINTS_PER_TRACE)
                if len(xs):
                    traces.append(Trace(f"{metric} rank {rank}", xs, ys, colour_of(index + number + 1), RANK_WIDTH,
                                        points=points, breaks=history.rank_breaks(metric, rank)))
        return traces

    def curve_charts(self, ranks: bool = True) -> list[Chart]:
        """A chart per group of metrics (losses together...), with the run's marks."""
        marks = self.marks()
        return [Chart(group, group, self.curve_traces(metrics, ranks), marks)
                for group, metrics in self.history.groups().items()]

    def _draw_curves(self) -> None:
        for chart in self.curve_charts():
            self.widget.draw(chart)

    def marks(self) -> list[Mark]:
        """The run's marks (the history model's): changes, rewinds, resizes, restarts, guard trips."""
        return marks_of(self._summary, self.run.reader.events, self.history.resumed_at)

    def _draw_workers(self, summary: dict[str, Any]) -> None:
        workers = sorted(summary.get("workers") or [], key=lambda worker: worker["rank"])
        late = set(stragglers(workers))
        pager = None
        if self.wide:
            pages = max(1, -(-len(workers) // RANKS_PER_PAGE))
            self.page = min(max(self.page, 0), pages - 1)
            shown = workers[self.page * RANKS_PER_PAGE:(self.page + 1) * RANKS_PER_PAGE]
            pager = {"page": self.page, "pages": pages,
                     "label": f"ranks {shown[0]['rank'] if shown else 0}–{shown[-1]['rank'] if shown else 0} "
                              f"of {len(workers)} (page {self.page + 1}/{pages})"}
        else:
            shown = workers
        self._table = worker_table(shown, late, self.history.text)
        self.widget.workers = {"summary": summary_table(workers, late) if self.wide else "", "table": self._table,
                               "pager": pager}
        draw_step_times(self.widget, shown)
        self.widget.debug_hint = debug_hint(self.run.name, summary)

    def _draw_notice(self) -> None:
        events = [e for e in self.run.reader.events
                  if e["kind"] in ("restart", "stall", "stacks", "resize", "note") or
                  (e["kind"] == "state" and e.get("state") == RunState.RESTARTING)]
        if events:
            self.note_problem(events[-1]["message"], colour="#ff7f0e")

    def _leave_static_summary(self, summary: dict[str, Any]) -> None:
        """Once, when the run has ended and every row is drawn: the summary line in the live view, and the
        static picture as the output's fallback (what nbconvert's HTML and GitHub show)."""
        self.widget.final = summary_line(self.run.name, summary, self.history)
        if self._static_handle is not None:
            self._static_handle.update(DashboardOutput(self.widget, self._fallback(summary)))

    def settle(self) -> None:
        """Called by a cell that waited for the run (``run.wait()``), on its thread, once this view drew the
        end: the end again, in that cell's time. The follower's thread may have drawn it between two cells,
        where a kernel's output goes with the finished cell and nbclient no longer records it."""
        if not self._finished:
            return
        with self._lock:
            self.widget.send_state()
            if self._static_handle is not None:
                self._static_handle.update(DashboardOutput(self.widget, self._fallback(self._summary)))


# What the page may ask of the view itself; everything else is the run's controls' (controls.ACTIONS).
VIEW_ACTIONS: dict[str, Any] = {"ranks": WidgetDashboard._choose_ranks, "page": WidgetDashboard._turn_page}
