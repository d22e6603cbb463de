"""The live view of a run: widgets in a notebook, one text line elsewhere.

Both read the same :class:`~nbtrain.Run` through its cursor. Redraws are
coalesced (at most one every ``REDRAW_INTERVAL_S``), widgets are updated in
place (never re-displayed), curves are downsampled before they reach the
browser, worker logs go to collapsed per-rank panes rather than the cell's
output, and a failed run turns red and stays red. When the run ends, a static
SVG + text summary is left in the output so the saved notebook shows the result.

A wide run (more than ``WIDE_RANKS`` ranks) is drawn as the mean across ranks
with a min-max band, plus lines for the ranks the user picks (``ranks=`` or the
"ranks:" box); its worker table is a summary by node and state and pages of
``RANKS_PER_PAGE`` ranks. Ranks that lag the median step of the running ranks
are listed in the header and marked in the table, whatever the width.
"""

from __future__ import annotations

import html
import re
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from nbtrain._states import RunState
from nbtrain._views.history import MetricHistory
from nbtrain._views.static_plot import COLOURS, svg_chart

REDRAW_INTERVAL_S = 0.25
LONG_POLL_S = 1.0
MAX_POINTS_PER_TRACE = 2000
LOG_PANE_CHARS = 20_000
CONFIG_CHARS = 300   # of the config in the header; the whole dict is `run.config`
TEXT_METRIC_CHARS = 60
WIDE_RANKS = 8               # above this many ranks: a band across ranks, a summarised and paged worker table
RANKS_PER_PAGE = 16
MAX_CHOSEN_RANKS = 16        # per-rank lines drawn on demand in a wide run
STRAGGLER_MIN_LAG = 10       # steps behind the median step of the running ranks...
STRAGGLER_LAG_SHARE = 0.05   # ...and this share of the median step, whichever is more
STRAGGLERS_LISTED = 8        # in the header; the rest are counted
RANK_HINT = ('<span style="opacity:0.7">lines of their own, besides the mean and the min–max band across '
             "ranks</span>")
# Shown instead of the progress bar while a run that does not know its total_steps goes on.
INDETERMINATE_BAR = (
    '<span class="nbtrain-progress-indeterminate" title="total_steps unknown" style="display:inline-block;'
    "width:240px;height:10px;border-radius:5px;vertical-align:middle;background:repeating-linear-gradient("
    '-45deg,#1f77b4 0 8px,#aec7e8 8px 16px);background-size:22.6px 22.6px;animation:nbtrain-stripes 1s linear '
    'infinite"></span><style>@keyframes nbtrain-stripes{to{background-position:22.6px 0}}</style>'
)
STATE_COLOURS = {
    "pending": "#777", "starting": "#1f77b4", "running": "#1f77b4", "restarting": "#ff7f0e",
    "succeeded": "#2ca02c", "failed": "#d62728", "stopped": "#555",
}


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show_dashboard(run: Any, *, follow: str = "background", ranks: Iterable[int] = ()) -> Any:
    """Show ``run`` live. ``follow``: "background" (a thread redraws), "none" (the caller calls ``update``).

    ``ranks``: in a wide run, the ranks drawn as lines of their own besides the band
    (``run.dashboard(ranks=[0, 17, 200])``); the "ranks:" box changes them later.
    """
    view: Any = WidgetDashboard(run, ranks=ranks) if in_notebook() else TextProgress(run)
    view.display()
    if follow == "background":
        view.follow_in_background()
    return view


def _elapsed(summary: dict[str, Any]) -> float:
    end = summary.get("ended") or summary.get("now") or time.time()
    return max(0.0, end - (summary.get("started") or end))


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_fraction(summary: dict[str, Any]) -> float | None:
    total_steps = summary.get("total_steps")
    if total_steps:
        return min(1.0, float(summary.get("step") or 0) / float(total_steps))
    total_epochs = summary.get("total_epochs")
    workers = summary.get("workers") or []
    if total_epochs and workers:
        epoch = min(w.get("epoch", 0) for w in workers)
        return min(1.0, float(epoch) / float(total_epochs))
    return None


def config_text(summary: dict[str, Any]) -> tuple[str, bool]:
    """The config as the header shows it, at most ``CONFIG_CHARS`` characters; (text, cut short).

    The cluster sends a short ``config_summary``; a summary from an older supervisor has the
    whole ``config`` instead, which is shortened here.
    """
    text = summary.get("config_summary")
    if not isinstance(text, str):
        config = summary.get("config")
        text = ", ".join(f"{k}={v}" for k, v in config.items()) if isinstance(config, dict) else ""
    if len(text) > CONFIG_CHARS:
        return text[:CONFIG_CHARS - 1] + "…", True
    return text, text.endswith(("…", " more)"))


def throughput(worker: dict[str, Any]) -> str:
    """samples/s when the rank knows its batch size, else steps/s, labelled; a dash before the first."""
    samples, steps = worker.get("samples_per_s"), worker.get("steps_per_s")
    if samples is not None:
        return f"{samples:.0f} samples/s"
    if steps is not None:
        return f"{steps:.3g} steps/s"
    return "–"


def stragglers(workers: list[dict[str, Any]]) -> list[int]:
    """Running ranks whose step lags the running ranks' median step by more than
    ``STRAGGLER_MIN_LAG`` steps and ``STRAGGLER_LAG_SHARE`` of the median."""
    running = [w for w in workers if w.get("state") == "running" and w.get("step") is not None]
    if len(running) < 2:
        return []
    median = float(np.median([w["step"] for w in running]))
    threshold = max(STRAGGLER_MIN_LAG, STRAGGLER_LAG_SHARE * median)
    return sorted(int(w["rank"]) for w in running if median - w["step"] > threshold)


def parse_ranks(text: str) -> list[int]:
    """``"0, 17, 200-203"`` -> ``[0, 17, 200, 201, 202, 203]``; ValueError says which part is wrong."""
    ranks: set[int] = set()
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match or (match[2] and int(match[2]) < int(match[1])):
            msg = f"not a rank or range of ranks: {part!r} (write e.g. 0, 17, 200-203)"
            raise ValueError(msg)
        ranks.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    if len(ranks) > MAX_CHOSEN_RANKS:
        msg = f"{len(ranks)} ranks chosen; at most {MAX_CHOSEN_RANKS} are drawn as lines of their own"
        raise ValueError(msg)
    return sorted(ranks)


def _take_new_rows(run: Any, history: MetricHistory) -> None:
    """Rows from where the history left off; rows the Run no longer holds are skipped, not waited for."""
    history.rows_seen = max(history.rows_seen, run.row_window_start)
    history.add(run.cached_rows(history.rows_seen))


def state_label(summary: dict[str, Any]) -> str:
    state = str(summary.get("state", "pending"))
    if state == "restarting" or (state in ("pending", "starting") and (summary.get("attempt") or 1) > 1):
        return f"restarting (attempt {summary.get('attempt', 1) + (1 if state == 'restarting' else 0)}" \
               f"/{summary.get('max_failures', 0) + 1})"
    return state


class _Follower:
    """Runs ``update`` until the run ends, from the caller's thread or a daemon thread."""

    run: Any
    thread: threading.Thread

    def update(self, wait_s: float = 0.0) -> bool:  # True once the run is terminal and drawn
        raise NotImplementedError

    def _tick(self) -> bool:
        """One long-poll update, then a pause so redraws stay at a few per second."""
        began = time.monotonic()
        done = self.update(wait_s=LONG_POLL_S)
        if not done:
            time.sleep(max(0.0, REDRAW_INTERVAL_S - (time.monotonic() - began)))
        return done

    def follow_in_background(self) -> threading.Thread:
        self.thread = threading.Thread(target=self._follow_quietly, name=f"nbtrain-dashboard-{self.run.name}",
                                       daemon=True)
        self.thread.start()
        return self.thread

    def _follow_quietly(self) -> None:
        failures = 0
        while True:
            try:
                if self._tick():
                    return
                failures = 0
            except Exception as exc:  # noqa: BLE001 - a lost connection must not kill the view
                failures += 1
                self.note_problem(f"Lost contact with the run ({exc}); retrying…")
                if failures > 120:
                    return
                time.sleep(1.0)

    def note_problem(self, message: str) -> None:
        pass


class TextProgress(_Follower):
    """Outside a notebook: one line every couple of seconds, and a summary at the end."""

    def __init__(self, run: Any, stream: Any = None, interval: float = 2.0) -> None:
        self.run = run
        self.stream = stream or sys.stdout
        self.interval = interval
        self.history = MetricHistory()
        self._last_print = 0.0

    def display(self) -> None:
        pass

    def line(self, summary: dict[str, Any]) -> str:
        fraction = progress_fraction(summary)
        share = f" {fraction:4.0%}" if fraction is not None else ""
        metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(self.history.latest.items())[:4])
        late = stragglers(summary.get("workers") or [])
        behind = (" stragglers " + ",".join(map(str, late[:STRAGGLERS_LISTED]))
                  + ("…" if len(late) > STRAGGLERS_LISTED else "")) if late else ""
        return (f"[nbtrain] {self.run.name} {state_label(summary)}{share} step {summary.get('step', 0)} "
                f"{len(summary.get('workers') or [])} workers{behind} "
                f"{_fmt_duration(_elapsed(summary))} {metrics}").rstrip()

    def update(self, wait_s: float = 0.0) -> bool:
        self.run.refresh(wait_s=wait_s)
        _take_new_rows(self.run, self.history)
        summary = self.run.cached_summary
        terminal = RunState(summary["state"]).is_terminal
        now = time.monotonic()
        if terminal or now - self._last_print >= self.interval:
            self._last_print = now
            print(self.line(summary), file=self.stream, flush=True)
        if terminal and summary.get("error"):
            print(summary["error"], file=self.stream, flush=True)
        return terminal


class WidgetDashboard(_Follower):
    """ipywidgets + plotly FigureWidget view of a run."""

    def __init__(self, run: Any, ranks: Iterable[int] = ()) -> None:
        import ipywidgets as w

        self.run = run
        self.history = MetricHistory()
        self.chosen_ranks = sorted(set(ranks))
        self.wide = False
        self.page = 0
        self._summary: dict[str, Any] = {}
        self._figures: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._drawn_rows = -1
        self._finished = False
        self._static_handle: Any = None
        self.header = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%"))
        self.progress_label = w.HTML()
        self.rank_box = w.Text(value=", ".join(map(str, self.chosen_ranks)), description="ranks:",
                               placeholder="e.g. 0, 17, 200-203", continuous_update=False,
                               tooltip="Ranks drawn as lines of their own, besides the mean and band")
        self.rank_note = w.HTML(RANK_HINT)
        self.rank_box.observe(self._on_ranks, names="value")
        self.rank_row = w.HBox([self.rank_box, self.rank_note], layout=w.Layout(display="none"))
        self.figure_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self.worker_summary = w.HTML()
        self.page_previous = w.Button(description="previous", icon="chevron-left", layout=w.Layout(width="auto"))
        self.page_next = w.Button(description="next", icon="chevron-right", layout=w.Layout(width="auto"))
        self.page_label = w.HTML()
        self.page_previous.on_click(lambda _button: self._turn_page(-1))
        self.page_next.on_click(lambda _button: self._turn_page(1))
        self.pager = w.HBox([self.page_previous, self.page_label, self.page_next], layout=w.Layout(display="none"))
        self.worker_table = w.HTML()
        self.notice = w.HTML()
        self.log_panes: dict[int, Any] = {}
        self.logs = w.Accordion(children=[], selected_index=None)
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="Stop the run: all workers are stopped and their resources freed")
        self.stop_button.on_click(self._on_stop)
        self.widget = w.VBox([
            self.header, w.HBox([self.progress, self.progress_label]), self.notice, self.rank_row, self.figure_box,
            self.worker_summary, self.pager, self.worker_table, self.logs, self.stop_button,
        ])
        self.widget.add_class("nbtrain-dashboard")
        self._log_text: dict[int, str] = {}
        self._log_cursor = 0

    # ------------------------------------------------------------------ display
    def display(self) -> None:
        from IPython.display import HTML, display

        display(self.widget)
        self._static_handle = display(HTML(""), display_id=True)

    def _ipython_display_(self) -> None:
        self.display()

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

    def note_problem(self, message: str) -> None:
        self.notice.value = f'<span style="color:#d62728">{html.escape(message)}</span>'

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
    def update(self, wait_s: float = 0.0) -> bool:
        self.run.refresh(wait_s=wait_s)  # outside the lock: a long poll must not block Stop's redraw
        with self._lock:
            # by position in the Run's history, not refresh()'s return value: rows a cell's
            # run.metrics fetched in the meantime are drawn too
            _take_new_rows(self.run, self.history)
            summary = self.run.cached_summary
            self._summary = summary
            wide = max(summary.get("world_size") or 0, len(self.history.ranks())) > WIDE_RANKS
            if wide != self.wide:
                self.wide, self._drawn_rows = wide, -1
                self.rank_row.layout.display = None if wide else "none"
            terminal = RunState(summary["state"]).is_terminal
            self._draw_header(summary)
            if self.history.rows_seen != self._drawn_rows:
                self._draw_curves()
                self._drawn_rows = self.history.rows_seen
            self._draw_workers(summary)
            self._draw_logs(summary)
            self._draw_notice()
            if terminal and not self._finished:
                self._finished = True
                self.stop_button.disabled = True
                self._leave_static_summary(summary)
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
                             f'<span class="nbtrain-elapsed">{_fmt_duration(_elapsed(summary))}</span> · '
                             f'{summary.get("world_size")} workers'
                             + self._straggler_note(summary)
                             + (f' · <code class="nbtrain-config">{html.escape(config)}</code>{whole}'
                                if config else ""))
        fraction = progress_fraction(summary)
        elapsed = _elapsed(summary)
        self.progress.bar_style = {"failed": "danger", "succeeded": "success", "stopped": "warning"}.get(state, "")
        if fraction is not None:
            self.progress.layout.display = None
            self.progress.value = fraction
            eta = elapsed / fraction * (1 - fraction) if fraction > 0 and state == "running" else None
            self.progress_label.value = f" {fraction:.0%}" + (f" · ETA {_fmt_duration(eta)}" if eta else "")
        elif RunState(state).is_terminal:
            self.progress.layout.display = None
            self.progress.value = 1.0  # a full bar in the state's colour (red stays red)
            self.progress_label.value = f" step {summary.get('step', 0)} · {_fmt_duration(elapsed)}"
        else:  # no total_steps: how far and how long, and a bar that says it is going
            self.progress.layout.display = "none"
            self.progress_label.value = (f"{INDETERMINATE_BAR} step {summary.get('step', 0)} · "
                                         f"{_fmt_duration(elapsed)}")

    def _straggler_note(self, summary: dict[str, Any]) -> str:
        late = stragglers(summary.get("workers") or [])
        if not late:
            return ""
        listed = ", ".join(map(str, late[:STRAGGLERS_LISTED])) + (
            f" and {len(late) - STRAGGLERS_LISTED} more" if len(late) > STRAGGLERS_LISTED else "")
        return (f' · <span class="nbtrain-stragglers" style="color:#ff7f0e" title="ranks whose step lags the '
                f'median step of the running ranks">straggler{"s" if len(late) > 1 else ""}: rank'
                f'{"s" if len(late) > 1 else ""} {listed}</span>')

    def curve_traces(self, metrics: list[str]) -> list[tuple[str, Any, Any, dict[str, Any]]]:
        """(name, x, y, scatter options) of one figure: per-rank lines and the mean, or in a wide run
        the mean, its min-max band and the chosen ranks' lines."""
        traces: list[tuple[str, Any, Any, dict[str, Any]]] = []
        for index, metric in enumerate(metrics):
            steps, mean, low, high = self.history.band(metric)
            if not self.wide:
                for rank in self.history.ranks(metric):
                    xs, ys = self.history.points(metric, rank, MAX_POINTS_PER_TRACE)
                    traces.append((f"{metric} rank {rank}", xs, ys, {"line": {"width": 1.0}, "opacity": 0.5}))
                traces.append((f"{metric} mean", steps, mean, {"line": {"width": 2.5}}))
                continue
            colour = COLOURS[index % len(COLOURS)]
            red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
            traces.append((f"{metric} min across ranks", steps, low,
                           {"line": {"width": 0, "color": colour}, "showlegend": False}))
            traces.append((f"{metric} min–max across ranks", steps, high,
                           {"line": {"width": 0, "color": colour}, "fill": "tonexty",
                            "fillcolor": f"rgba({red},{green},{blue},0.2)"}))
            traces.append((f"{metric} mean", steps, mean, {"line": {"width": 2.5, "color": colour}}))
            for rank in self.chosen_ranks:
                xs, ys = self.history.points(metric, rank, MAX_POINTS_PER_TRACE)
                if len(xs):
                    traces.append((f"{metric} rank {rank}", xs, ys, {"line": {"width": 1.0}}))
        return traces

    def _draw_curves(self) -> None:
        import plotly.graph_objects as go

        for group, metrics in self.history.groups().items():
            figure = self._figures.get(group)
            traces = self.curve_traces(metrics)
            if figure is None:
                figure = go.FigureWidget(layout=dict(
                    title=dict(text=group, x=0.02), height=280, width=460, margin=dict(l=50, r=10, t=40, b=40),
                    xaxis_title="step", legend=dict(font=dict(size=10)), uirevision=group,
                ))
                self._figures[group] = figure
                self.figure_box.children = tuple(self._figures.values())
            wanted = {name for name, *_ in traces}
            if any(trace.name not in wanted for trace in figure.data):  # ranks unchosen, or the run turned wide
                figure.data = tuple(trace for trace in figure.data if trace.name in wanted)
            with figure.batch_update():
                existing = {trace.name: trace for trace in figure.data}
                for name, xs, ys, options in traces:
                    if name in existing:
                        existing[name].x, existing[name].y = xs, ys
                    else:
                        figure.add_scatter(x=xs, y=ys, name=name, mode="lines", **options)

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
            self.worker_summary.value = self._summary_table(workers, late)
        else:
            shown = workers
            self.worker_summary.value = ""
        self.worker_table.value = (
            '<table class="nbtrain-workers" style="border-collapse:collapse;font-size:0.9em">'
            "<thead><tr><th>rank</th><th>node</th><th>pid</th><th>device</th><th>state</th><th>step</th>"
            "<th>speed</th><th>memory</th><th>heartbeat</th><th>text metrics</th></tr></thead><tbody>"
            + "".join(self._worker_row(worker, worker["rank"] in late) for worker in shown) + "</tbody></table>")

    def _worker_row(self, worker: dict[str, Any], late: bool) -> str:
        state = worker.get("state", "")
        age = worker.get("heartbeat_age_s")
        if state in ("running", "starting") and age is not None and age > 10:
            state = f"no heartbeat {age:.0f}s"
        colour = {"failed": "#d62728", "dead": "#d62728", "stalled": "#ff7f0e",
                  "finished": "#2ca02c"}.get(worker.get("state", ""), "inherit")
        if state.startswith("no heartbeat"):
            colour = "#ff7f0e"
        memory = f"{worker['rss_mb']:.0f} MB" if worker.get("rss_mb") else "–"
        if worker.get("gpu_mem_mb") is not None:
            memory += f" / GPU {worker['gpu_mem_mb']:.0f} MB"
        mark = (' class="nbtrain-straggler" style="background:#fff3e0" title="straggler: behind the median step"'
                if late else "")
        return (f'<tr data-rank="{worker["rank"]}"{mark}><td>{worker["rank"]}</td>'
                f'<td>{html.escape(str(worker.get("node")))}</td>'
                f'<td>{worker.get("pid")}</td><td>{html.escape(str(worker.get("device")))}</td>'
                f'<td style="color:{colour}" class="nbtrain-worker-state">{html.escape(state)}</td>'
                f'<td class="nbtrain-worker-step">{worker.get("step", 0)}</td>'
                f'<td class="nbtrain-worker-rate">{throughput(worker)}</td><td>{memory}</td>'
                f'<td>{"–" if age is None else f"{age:.1f}s ago"}</td>'
                f'<td class="nbtrain-worker-text">{self._text_metrics(worker["rank"])}</td></tr>')

    @staticmethod
    def _summary_table(workers: list[dict[str, Any]], late: set[int]) -> str:
        """A wide run's workers by node and state: how many, their steps, and the stragglers among them."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for worker in workers:
            groups.setdefault((str(worker.get("node")), str(worker.get("state", ""))), []).append(worker)
        rows = []
        for (node, state), members in sorted(groups.items()):
            steps = np.array([m.get("step") or 0 for m in members])
            behind = sorted(m["rank"] for m in members if m["rank"] in late)
            rows.append(f'<tr data-node="{html.escape(node)}" data-state="{html.escape(state)}">'
                        f"<td>{html.escape(node)}</td><td>{html.escape(state)}</td>"
                        f'<td class="nbtrain-summary-count">{len(members)}</td><td>{steps.min()}</td>'
                        f"<td>{np.median(steps):g}</td><td>{steps.max()}</td>"
                        f'<td style="color:#ff7f0e">{", ".join(map(str, behind))}</td></tr>')
        return ('<table class="nbtrain-worker-summary" style="border-collapse:collapse;font-size:0.9em">'
                "<thead><tr><th>node</th><th>state</th><th>ranks</th><th>step min</th><th>median</th>"
                "<th>max</th><th>stragglers</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")

    def _text_metrics(self, rank: int) -> str:
        """What the rank last reported as text (``report(phase="warmup")``), which no curve shows."""
        values = self.history.text.get(rank, {})
        return html.escape(" · ".join(
            f"{key}={value if len(value) <= TEXT_METRIC_CHARS else value[:TEXT_METRIC_CHARS - 1] + '…'}"
            for key, value in values.items()))

    def _draw_logs(self, summary: dict[str, Any]) -> None:
        import ipywidgets as w

        entries = self.run.cached_log_entries(self._log_cursor)
        self._log_cursor += len(entries)
        changed = set()
        for entry in entries:
            rank = entry["rank"]
            text = self._log_text.get(rank, "") + entry["text"]
            self._log_text[rank] = text[-LOG_PANE_CHARS:]
            changed.add(rank)
        failing = {f["rank"] for f in summary.get("failures") or [] if f.get("rank") is not None
                   and f.get("attempt") == summary.get("attempt") and not f.get("secondary")}
        for failure in summary.get("failures") or []:
            rank = failure.get("rank")
            if rank is not None and failure.get("traceback") and rank not in self._log_text:
                self._log_text[rank] = failure["traceback"]
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
        events = [e for e in self.run.cached_events() if e["kind"] in ("restart", "stall") or
                  (e["kind"] == "state" and e["message"].startswith("restarting"))]
        if events:
            last = events[-1]
            self.notice.value = (f'<span class="nbtrain-notice" style="color:#ff7f0e">'
                                 f'{html.escape(last["message"])}</span>')

    def _leave_static_summary(self, summary: dict[str, Any]) -> None:
        from IPython.display import HTML

        charts = []
        for group, metrics in self.history.groups().items():
            series = {f"{metric} mean": self.history.mean(metric) for metric in metrics}
            charts.append(svg_chart(group, series))
        state = summary["state"]
        latest = ", ".join(f"{k}={v:.4g}" for k, v in sorted(self.history.latest.items()))
        text = (f"Run {self.run.name}: {state} after {_fmt_duration(_elapsed(summary))}, "
                f"{summary.get('world_size')} workers, attempt {summary.get('attempt')}, "
                f"{self.history.rows_seen} metric rows. Final: {latest or 'no metrics'}.")
        error = summary.get("error")
        body = (f'<div class="nbtrain-summary"><p style="color:{STATE_COLOURS.get(state, "#000")}">'
                f"{html.escape(text)}</p>{''.join(charts)}"
                + (f'<pre style="color:#d62728">{html.escape(error)}</pre>' if error else "") + "</div>")
        if self._static_handle is not None:
            self._static_handle.update(HTML(body))
