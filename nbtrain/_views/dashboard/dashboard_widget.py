"""The run dashboard as one widget of our own (anywidget): what crosses between the kernel and the page.

One widget, one path, in every front end that shows anywidgets (JupyterLab, Notebook 7, VS Code, Colab, and
marimo through ``marimo.ui.anywidget``). Its front end is ``static/charts.js`` (the chart renderer every live
chart of nbtrain uses) joined with ``static/dashboard.js`` (the rest of the page) into one ES module.

Kernel → page: each part of the dashboard is a small synced trait, sent only when it changed (traitlets compares
the values): the header, the worker table and the final line as HTML the kernel escaped (the same HTML the saved
notebook's static summary shows, so one renderer makes both); the progress, the notice, the ranks box, the pager
and the control row as JSON the page builds its inputs from. Points (:class:`~.charts_widget.ChartsWidget`) and
each rank's log text travel as increments in custom messages; a view that opens late says "hello" and is sent
both whole. When the run has ended, :meth:`DashboardWidget.freeze` keeps the picture's points and the logs'
tails, bounded, in the model: what a notebook saved with widget state shows with no kernel behind it.

Page → kernel: every click or edit is one custom message, ``{"action": name, ...fields, "id": ...}``, handed to
``on_action`` (the dashboard's dispatcher) on the thread the kernel handles widget messages on; a blocking
cell serves those while it waits (:mod:`nbtrain._client.kernel.widget_messages`: they are ``comm_msg`` like any
widget message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import traitlets

from nbtrain._views.dashboard.charts_widget import ChartsWidget, front_end

LOG_PANE_CHARS = 20_000      # of each rank's log, in the kernel and on the page: its tail
LOG_SNAPSHOT_CHARS = 32_000  # of all the logs, kept in a finished dashboard's saved state (failing ranks first)


class DashboardWidget(ChartsWidget):
    """The run dashboard's model: its parts as traits, points and logs as increments, actions as messages."""

    _esm = front_end("charts.js", "dashboard.js")
    _css = front_end("charts.css", "dashboard.css")
    header = traitlets.Unicode("").tag(sync=True)        # HTML: name, state badge, elapsed, workers, config…
    # {"fraction": float | None, "style": "" | "danger" | "success" | "warning", "label": HTML}
    progress: traitlets.Dict[str, Any] = traitlets.Dict().tag(sync=True)
    notice: traitlets.Dict[str, Any] = traitlets.Dict().tag(sync=True)      # {"text", "colour"}: plain text
    ranks: traitlets.Dict[str, Any] = traitlets.Dict().tag(sync=True)       # {"shown", "value", "error"}
    # {"summary": HTML, "table": HTML, "pager": {"page", "pages", "label"} | None}
    workers: traitlets.Dict[str, Any] = traitlets.Dict().tag(sync=True)
    debug_hint = traitlets.Unicode("").tag(sync=True)    # HTML
    log_panes: traitlets.List[Any] = traitlets.List().tag(sync=True)       # [{"rank", "title", "failed", "open"}]
    log_snapshot: traitlets.Dict[str, Any] = traitlets.Dict().tag(sync=True)  # {rank: its log's tail}, once ended
    controls: traitlets.Dict[str, Any] = traitlets.Dict().tag(sync=True)   # :meth:`Controls.state`
    answer = traitlets.Unicode("").tag(sync=True)        # HTML: the stacks, or the profile's table
    final = traitlets.Unicode("").tag(sync=True)         # HTML: the finished run's summary line

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._logs: dict[int, str] = {}  # each rank's log as the views hold it
        self.on_action: Callable[[dict[str, Any]], None] | None = None

    def add_logs(self, new: dict[int, str]) -> None:
        """Append ``new`` text to ranks' logs (each kept to its last ``LOG_PANE_CHARS``) and send only that."""
        parts = []
        for rank, text in sorted(new.items()):
            whole = self._logs.get(rank, "") + text
            self._logs[rank] = whole[-LOG_PANE_CHARS:]
            if not text:
                continue
            if len(text) >= LOG_PANE_CHARS:
                parts.append({"rank": rank, "text": self._logs[rank], "mode": "replace"})
            else:
                parts.append({"rank": rank, "text": text, "mode": "append"})
        if parts:
            self.send({"kind": "logs", "cap": LOG_PANE_CHARS, "parts": parts})

    def log_text(self, rank: int) -> str:
        """What rank ``rank``'s log pane holds now."""
        return self._logs.get(rank, "")

    def logged_ranks(self) -> list[int]:
        """The ranks that have a log pane."""
        return sorted(self._logs)

    def hello(self) -> None:
        super().hello()
        if self._logs:
            self.send({"kind": "logs", "cap": LOG_PANE_CHARS, "parts": [
                {"rank": rank, "text": text, "mode": "replace"} for rank, text in sorted(self._logs.items())]})

    def freeze(self, failing: set[int] | frozenset[int] = frozenset()) -> None:
        """The points (:meth:`ChartsWidget.freeze`) and the logs' tails kept in the model, at most
        ``LOG_SNAPSHOT_CHARS`` of logs however many ranks: the ``failing`` ranks' first, then the others, each
        given an even share of what is left."""
        super().freeze()
        order = sorted(self._logs, key=lambda rank: (rank not in failing, rank))
        left, kept = LOG_SNAPSHOT_CHARS, {}
        for index, rank in enumerate(order):
            share = min(LOG_PANE_CHARS, left // (len(order) - index))
            tail = self._logs[rank][-share:] if share > 0 else ""
            kept[str(rank)] = tail
            left -= len(tail)
        self.log_snapshot = kept

    def _on_view_message(self, widget: Any, content: Any, buffers: Any) -> None:
        if isinstance(content, dict) and "action" in content and self.on_action is not None:
            self.on_action(content)
            return
        super()._on_view_message(widget, content, buffers)
