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
from collections.abc import Iterable
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
from nbtrain._views.dashboard.charts_widget import ChartsWidget
from nbtrain._views.dashboard.control_row import ControlRow
from nbtrain._views.dashboard.follower import REDRAW_INTERVAL_S, STRAGGLERS_LISTED, Follower, TextProgress
from nbtrain._views.dashboard.front_end import (
    DashboardOutput,
    alone_panel,
    execution_count,
    in_marimo,
    in_notebook,
    marimo_output,
    running_cell,
    widget_tree,
)
from nbtrain._views.dashboard.history import MetricHistory, take_new_rows
from nbtrain._views.dashboard.static_plot import static_summary, summary_line
from nbtrain._views.dashboard.step_time_plot import StepTimePlot, debug_hint
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
    RANK_HINT,
    RANKS_PER_PAGE,
    parse_ranks,
    stragglers,
    summary_table,
    worker_table,
)

MAX_POINTS_PER_TRACE = 2000
LOG_PANE_CHARS = 20_000
WIDE_RANKS = 8               # above this many ranks: a band across ranks, a summarised and paged worker table


def show_dashboard(run: Any, *, follow: str = "background", ranks: Iterable[int] = ()) -> Any:
    """Show ``run`` live. ``follow``: "background" (a thread redraws), "none" (the caller calls ``update``).

    ``ranks``: in a wide run, the ranks drawn as lines of their own besides the band
    (``run.dashboard(ranks=[0, 17, 200])``); the "ranks:" box changes them later.
    """
    marimo = in_marimo()
    view: Any = WidgetDashboard(run, ranks=ranks, alone=marimo) if marimo or in_notebook() else TextProgress(run)
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
    """ipywidgets (header, table, logs, controls) and our own charts widget (curves, step times), shown as
    one output whose static fallback is the summary (:class:`DashboardOutput`)."""

    def __init__(self, run: Any, ranks: Iterable[int] = (), alone: bool = False) -> None:
        """``alone``: the front end shows only the charts widget (marimo), which then carries the rest too."""
        import ipywidgets as w

        self.run = run
        self.alone = alone
        # its log panes show each failing rank's traceback, so a blocking cell need not print them again
        self.shows_tracebacks = not alone
        self.history = MetricHistory()
        self.chosen_ranks = sorted(set(ranks))
        self.wide = False
        self.page = 0
        self._summary: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._drawn_rows = -1
        self._drawn_at = 0.0        # monotonic time of the last redraw
        self._undrawn = False       # rows or a summary taken since then, waiting for the throttle
        self._finished = False
        self._static_handle: Any = None
        self._shown_in: int | None = None  # the execution count of the cell that displayed it
        self.header = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%"))
        self.progress_label = w.HTML()
        self.rank_box = w.Text(value=", ".join(map(str, self.chosen_ranks)), description="ranks:",
                               placeholder="e.g. 0, 17, 200-203", continuous_update=False,
                               tooltip="Ranks drawn as lines of their own, besides the mean and band")
        self.rank_note = w.HTML(RANK_HINT)
        self.rank_box.observe(self._on_ranks, names="value")
        self.rank_row = w.HBox([self.rank_box, self.rank_note], layout=w.Layout(display="none"))
        self.charts = ChartsWidget()
        self.worker_summary = w.HTML()
        self.page_previous = w.Button(description="previous", icon="chevron-left", layout=w.Layout(width="auto"))
        self.page_next = w.Button(description="next", icon="chevron-right", layout=w.Layout(width="auto"))
        self.page_label = w.HTML()
        self.page_previous.on_click(lambda _button: self._turn_page(-1))
        self.page_next.on_click(lambda _button: self._turn_page(1))
        self.pager = w.HBox([self.page_previous, self.page_label, self.page_next], layout=w.Layout(display="none"))
        self.worker_table = w.HTML()
        self.step_times = StepTimePlot()
        self.debug_hint = w.HTML()
        self.notice = w.HTML()
        self.log_panes: dict[int, Any] = {}
        self.logs = w.Accordion(children=[], selected_index=None)
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="Stop the run: all workers are stopped and their resources freed")
        self.stop_button.on_click(self._on_stop)
        self.charts.on_action = lambda name: self._on_stop(None) if name == "Stop" else None
        self.controls = ControlRow(run, self.note_problem, self.stop_button)
        self.final = w.HTML()  # the finished run's summary line, in the live view (the fallback has it too)
        self.widget = w.VBox([
            self.header, w.HBox([self.progress, self.progress_label]), self.notice, self.rank_row, self.charts,
            self.worker_summary, self.pager, self.worker_table, self.step_times.widget, self.debug_hint, self.logs,
            self.controls.widget, self.final,
        ])
        self.widget.add_class("nbtrain-dashboard")
        self._log_text: dict[int, str] = {}
        self._tracebacks_shown: set[tuple[int, str]] = set()  # (rank, traceback) already in its log pane
        self._log_cursor = 0

    # ------------------------------------------------------------------ display
    def display(self) -> None:
        """Show the dashboard: one output, the live widget with the summary as its static fallback. (marimo
        shows what the cell returns: :meth:`_display_`.)"""
        from IPython.display import display

        if self.alone:
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
        """marimo's display protocol: the charts widget, which carries the header, table and Stop there."""
        return marimo_output(self.charts)

    def _fallback(self, summary: dict[str, Any] | None = None) -> str:
        """The text/html of the dashboard's output: where widgets do not render, the run's name and state;
        once it ended, its static summary."""
        if summary is None:
            return (f'<div class="nbtrain-summary nbtrain-live-fallback">Run <b>{html.escape(self.run.name)}</b>: '
                    f"its live dashboard is a widget; this front end does not show widgets.</div>")
        return static_summary(self.run.name, summary, self.history, self.curve_charts(ranks=False),
                              self.worker_table.value)

    def _on_stop(self, _button: Any) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        threading.Thread(target=self._stop_now, daemon=True).start()

    def _stop_now(self) -> None:
        try:
            self.run.stop()
        except Exception as exc:  # noqa: BLE001
            self.note_problem(f"Stop failed: {exc}")
        self.stop_button.description = "Stopped"

    def note_problem(self, message: str, colour: str = "#d62728") -> None:
        self.notice.value = f'<span style="color:{colour}">{html.escape(message)}</span>'

    def _on_ranks(self, change: dict[str, Any]) -> None:
        try:
            ranks = parse_ranks(change["new"])
        except ValueError as exc:
            self.rank_note.value = f'<span style="color:#d62728">{html.escape(str(exc))}</span>'
            return
        self.rank_note.value = RANK_HINT
        with self._lock:
            self.chosen_ranks = ranks
            self._draw_curves()

    def _turn_page(self, by: int) -> None:
        with self._lock:
            self.page += by
            self._draw_workers(self._summary)

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
                self.rank_row.layout.display = None if wide else "none"
            # ended, and every row is here: a long history's last pages come after the final state
            terminal = RunState(summary["state"]).is_terminal and self.run.reader.caught_up
            now = time.monotonic()
            if coalesce and not terminal and now - self._drawn_at < REDRAW_INTERVAL_S:
                self._undrawn = True  # drawn when due: redraws stay at a few per second
                return False
            self._drawn_at, self._undrawn = now, False
            self._draw_header(summary)
            self.controls.update(summary)
            if self.history.rows_seen != self._drawn_rows:
                self._draw_curves()
                self._drawn_rows = self.history.rows_seen
            self._draw_workers(summary)
            self._draw_logs(summary)
            self._draw_notice()
            if terminal and not self._finished:
                self._finished = True
                self.stop_button.disabled = True
                self.charts.freeze()
                self._leave_static_summary(summary)
            if self.alone:
                self.charts.html, self.charts.actions = alone_panel(self), [] if terminal else ["Stop"]
            return terminal

    def _draw_header(self, summary: dict[str, Any]) -> None:
        state = summary["state"]
        colour = STATE_COLOURS.get(state, "#777")
        label = state_label(summary)
        badge = (f'<span class="nbtrain-state" data-state="{state}" style="background:{colour};color:white;'
                 f'padding:2px 8px;border-radius:10px">{html.escape(label)}</span>')
        config, cut = config_text(summary)
        whole = (' <span class="nbtrain-config-more" style="opacity:0.7">(the whole config: '
                 '<code>run.config</code>)</span>') if cut else ""
        self.header.value = (f'<b style="font-size:1.1em">{html.escape(self.run.name)}</b> {badge} '
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
        self.progress.bar_style = {"failed": "danger", "succeeded": "success", "stopped": "warning"}.get(state, "")
        if fraction is not None:
            self.progress.layout.display = None
            self.progress.value = fraction
            eta = seconds / fraction * (1 - fraction) if fraction > 0 and state == "running" else None
            self.progress_label.value = f" {fraction:.0%}" + (f" · ETA {fmt_duration(eta)}" if eta else "") + counted
        elif RunState(state).is_terminal:
            self.progress.layout.display = None
            self.progress.value = 1.0  # a full bar in the state's colour (red stays red)
            self.progress_label.value = f" step {summary.get('step', 0)}{counted} · {fmt_duration(seconds)}"
        else:  # no total_steps: how far and how long, and a bar that says it is going
            self.progress.layout.display = "none"
            self.progress_label.value = (f"{indeterminate_bar(seconds)} step {summary.get('step', 0)}{counted} · "
                                         f"{fmt_duration(seconds)}")

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
            self.charts.draw(chart)

    def marks(self) -> list[Mark]:
        """The run's marks (the history model's): changes, rewinds, resizes, restarts, guard trips."""
        return marks_of(self._summary, self.run.reader.events, self.history.resumed_at)

    def _draw_workers(self, summary: dict[str, Any]) -> None:
        workers = sorted(summary.get("workers") or [], key=lambda worker: worker["rank"])
        late = set(stragglers(workers))
        self.pager.layout.display = None if self.wide else "none"
        if self.wide:
            pages = max(1, -(-len(workers) // RANKS_PER_PAGE))
            self.page = min(max(self.page, 0), pages - 1)
            shown = workers[self.page * RANKS_PER_PAGE:(self.page + 1) * RANKS_PER_PAGE]
            self.page_previous.disabled, self.page_next.disabled = self.page == 0, self.page == pages - 1
            self.page_label.value = (f'<span class="nbtrain-worker-page" style="padding:0 8px">ranks '
                                     f'{shown[0]["rank"] if shown else 0}–{shown[-1]["rank"] if shown else 0} '
                                     f"of {len(workers)} (page {self.page + 1}/{pages})</span>")
            self.worker_summary.value = summary_table(workers, late)
        else:
            shown = workers
            self.worker_summary.value = ""
        self.worker_table.value = worker_table(shown, late, self.history.text)
        self.step_times.draw(shown)
        self.debug_hint.value = debug_hint(self.run.name, summary)

    def _draw_logs(self, summary: dict[str, Any]) -> None:
        import ipywidgets as w

        entries = self.run.reader.logs_since(self._log_cursor)
        self._log_cursor += len(entries)
        changed = set()
        for entry in entries:
            rank = entry["rank"]
            text = self._log_text.get(rank, "") + entry["text"]
            self._log_text[rank] = text[-LOG_PANE_CHARS:]
            changed.add(rank)
        failing = {f["rank"] for f in summary.get("failures") or [] if f.get("rank") is not None
                   and f.get("attempt") == summary.get("attempt") and not f.get("secondary")}
        for failure in summary.get("failures") or []:  # the pane shows it even when the rank printed none
            rank, traceback = failure.get("rank"), failure.get("traceback")
            if rank is not None and traceback and (rank, traceback) not in self._tracebacks_shown:
                self._tracebacks_shown.add((rank, traceback))
                if traceback not in self._log_text.get(rank, ""):
                    self._log_text[rank] = (self._log_text.get(rank, "") + "\n" + traceback)[-LOG_PANE_CHARS:]
                changed.add(rank)
        new_panes = False
        for rank in sorted(changed | failing):
            if rank not in self.log_panes:
                self.log_panes[rank] = w.HTML()
                new_panes = True
            self.log_panes[rank].value = (f'<pre class="nbtrain-log" data-rank="{rank}" style="max-height:300px;'
                                          f'overflow:auto;font-size:0.85em">'
                                          f'{html.escape(self._log_text.get(rank, ""))}</pre>')
        if new_panes:
            ranks = sorted(self.log_panes)
            self.logs.children = tuple(self.log_panes[r] for r in ranks)
            for index, rank in enumerate(ranks):
                title = f"rank {rank} log" + (" — failed" if rank in failing else "")
                self.logs.set_title(index, title)
        if failing and self.logs.selected_index is None:
            ranks = sorted(self.log_panes)
            self.logs.selected_index = ranks.index(min(failing))
            self.logs.set_title(ranks.index(min(failing)), f"rank {min(failing)} log — failed")

    def _draw_notice(self) -> None:
        events = [e for e in self.run.reader.events
                  if e["kind"] in ("restart", "stall", "stacks", "resize", "note") or
                  (e["kind"] == "state" and e.get("state") == RunState.RESTARTING)]
        if events:
            last = events[-1]
            self.notice.value = (f'<span class="nbtrain-notice" style="color:#ff7f0e">'
                                 f'{html.escape(last["message"])}</span>')

    def _leave_static_summary(self, summary: dict[str, Any]) -> None:
        """Once, when the run has ended and every row is drawn: the summary line in the live view, and the
        static picture as the output's fallback (what nbconvert's HTML and GitHub show)."""
        self.final.value = summary_line(self.run.name, summary, self.history)
        if self._static_handle is not None:
            self._static_handle.update(DashboardOutput(self.widget, self._fallback(summary)))

    def settle(self) -> None:
        """Called by a cell that waited for the run (``run.wait()``), on its thread, once this view drew the
        end: the end again, in that cell's time. The follower's thread may have drawn it between two cells,
        where a kernel's output goes with the finished cell and nbclient no longer records it."""
        if not self._finished or self.alone:
            return
        with self._lock:
            for model in widget_tree(self.widget):
                model.send_state()
            if self._static_handle is not None:
                self._static_handle.update(DashboardOutput(self.widget, self._fallback(self._summary)))
