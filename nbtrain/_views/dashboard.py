"""The live view of a run: widgets in a notebook, one text line elsewhere.

Both read the same :class:`~nbtrain.Run` through its cursor. Redraws are
coalesced (at most one every ``REDRAW_INTERVAL_S``), widgets are updated in
place (never re-displayed), curves are downsampled before they reach the
browser, worker logs go to collapsed per-rank panes rather than the cell's
output, and a failed run turns red and stays red. When the run ends, a static
SVG + text summary is left in the output so the saved notebook shows the result.
"""

from __future__ import annotations

import html
import sys
import threading
import time
from typing import Any

from nbtrain._states import RunState
from nbtrain._views.downsample import downsample
from nbtrain._views.history import MetricHistory
from nbtrain._views.static_plot import svg_chart

REDRAW_INTERVAL_S = 0.25
LONG_POLL_S = 1.0
MAX_POINTS_PER_TRACE = 2000
LOG_PANE_CHARS = 20_000
CONFIG_CHARS = 300   # of the config in the header; the whole dict is `run.config`
TEXT_METRIC_CHARS = 60
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


def show_dashboard(run: Any, *, follow: str = "background") -> Any:
    """Show ``run`` live. ``follow``: "background" (a thread redraws), "none" (the caller calls ``update``)."""
    view: Any = WidgetDashboard(run) if in_notebook() else TextProgress(run)
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
        return (f"[nbtrain] {self.run.name} {state_label(summary)}{share} step {summary.get('step', 0)} "
                f"{len(summary.get('workers') or [])} workers {_fmt_duration(_elapsed(summary))} {metrics}").rstrip()

    def update(self, wait_s: float = 0.0) -> bool:
        self.run.refresh(wait_s=wait_s)
        self.history.add(self.run.cached_rows(self.history.rows_seen))
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

    def __init__(self, run: Any) -> None:
        import ipywidgets as w

        self.run = run
        self.history = MetricHistory()
        self._figures: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._drawn_rows = -1
        self._finished = False
        self._static_handle: Any = None
        self.header = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%"))
        self.progress_label = w.HTML()
        self.figure_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self.worker_table = w.HTML()
        self.notice = w.HTML()
        self.log_panes: dict[int, Any] = {}
        self.logs = w.Accordion(children=[], selected_index=None)
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="Stop the run: all workers are stopped and their resources freed")
        self.stop_button.on_click(self._on_stop)
        self.widget = w.VBox([
            self.header, w.HBox([self.progress, self.progress_label]), self.notice, self.figure_box,
            self.worker_table, self.logs, self.stop_button,
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

    # ------------------------------------------------------------------ drawing
    def update(self, wait_s: float = 0.0) -> bool:
        self.run.refresh(wait_s=wait_s)  # outside the lock: a long poll must not block Stop's redraw
        with self._lock:
            # by position in the Run's history, not refresh()'s return value: rows a cell's
            # run.metrics fetched in the meantime are drawn too
            self.history.add(self.run.cached_rows(self.history.rows_seen))
            summary = self.run.cached_summary
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

    def _draw_curves(self) -> None:
        import plotly.graph_objects as go

        for group, metrics in self.history.groups().items():
            figure = self._figures.get(group)
            traces = []
            for metric in metrics:
                for rank, (xs, ys) in self.history.per_rank(metric).items():
                    dx, dy = downsample(xs, ys, MAX_POINTS_PER_TRACE)
                    traces.append((f"{metric} rank {rank}", dx, dy, {"width": 1.0}, 0.5))
                mx, my = self.history.mean(metric)
                dx, dy = downsample(mx, my, MAX_POINTS_PER_TRACE)
                traces.append((f"{metric} mean", dx, dy, {"width": 2.5}, 1.0))
            if figure is None:
                figure = go.FigureWidget(layout=dict(
                    title=dict(text=group, x=0.02), height=280, width=460, margin=dict(l=50, r=10, t=40, b=40),
                    xaxis_title="step", legend=dict(font=dict(size=10)), uirevision=group,
                ))
                self._figures[group] = figure
                self.figure_box.children = tuple(self._figures.values())
            with figure.batch_update():
                existing = {trace.name: trace for trace in figure.data}
                for name, dx, dy, line, opacity in traces:
                    if name in existing:
                        existing[name].x, existing[name].y = dx, dy
                    else:
                        figure.add_scatter(x=dx, y=dy, name=name, mode="lines", line=line, opacity=opacity)

    def _draw_workers(self, summary: dict[str, Any]) -> None:
        rows = []
        for worker in summary.get("workers") or []:
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
            rows.append(
                f'<tr data-rank="{worker["rank"]}"><td>{worker["rank"]}</td>'
                f'<td>{html.escape(str(worker.get("node")))}</td>'
                f'<td>{worker.get("pid")}</td><td>{html.escape(str(worker.get("device")))}</td>'
                f'<td style="color:{colour}" class="nbtrain-worker-state">{html.escape(state)}</td>'
                f'<td class="nbtrain-worker-step">{worker.get("step", 0)}</td>'
                f'<td class="nbtrain-worker-rate">{throughput(worker)}</td><td>{memory}</td>'
                f'<td>{"–" if age is None else f"{age:.1f}s ago"}</td>'
                f'<td class="nbtrain-worker-text">{self._text_metrics(worker["rank"])}</td></tr>')
        self.worker_table.value = (
            '<table class="nbtrain-workers" style="border-collapse:collapse;font-size:0.9em">'
            "<thead><tr><th>rank</th><th>node</th><th>pid</th><th>device</th><th>state</th><th>step</th>"
            "<th>speed</th><th>memory</th><th>heartbeat</th><th>text metrics</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")

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
