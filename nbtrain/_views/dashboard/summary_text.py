"""A run's summary in words, as the dashboard's header and the text progress line show it."""

from __future__ import annotations

import html
import time
from typing import Any

CONFIG_CHARS = 300   # of the config in the header; the whole dict is `run.config`
STATE_COLOURS = {
    "pending": "#777", "starting": "#1f77b4", "running": "#1f77b4", "restarting": "#ff7f0e",
    "succeeded": "#2ca02c", "failed": "#d62728", "stopped": "#555",
}
STRIPES_PX = 22.6         # the indeterminate bar's stripes repeat every STRIPES_PX along it
STRIPES_PX_PER_S = 9.0    # and move this far per second of the run, at each redraw


def indeterminate_bar(seconds: float) -> str:
    """Shown instead of the progress bar while a run that does not know its total_steps goes on.

    Its stripes sit where the run's elapsed time puts them, so they move each time the dashboard
    redraws, and stand still when nothing arrives. Not a CSS animation: an infinite one kept the
    browser drawing 60 frames a second for as long as the run went on (0.17-0.19 of a core in
    Chromium, measured; 0.09 with steps() or a transform).
    """
    offset = seconds * STRIPES_PX_PER_S % STRIPES_PX
    return ('<span class="nbtrain-progress-indeterminate" title="total_steps unknown" style="display:inline-block;'
            "width:240px;height:10px;border-radius:5px;vertical-align:middle;background:repeating-linear-gradient("
            f"-45deg,#1f77b4 0 8px,#aec7e8 8px 16px);background-size:{STRIPES_PX}px {STRIPES_PX}px;"
            f'background-position:{offset:.1f}px 0"></span>')


def elapsed(summary: dict[str, Any]) -> float:
    end = summary.get("ended") or summary.get("now") or time.time()
    return max(0.0, end - (summary.get("started") or end))


def fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_fraction(summary: dict[str, Any]) -> float | None:
    """How far the run is, from its expected total (``total_steps``, else ``total_epochs``); None without
    one. The total is an estimate (a loop may end early, an epoch counts once the next begins): a
    run that succeeded has done all it was going to, so its bar is full."""
    total_steps = summary.get("total_steps")
    total_epochs = summary.get("total_epochs")
    workers = summary.get("workers") or []
    if not total_steps and not (total_epochs and workers):
        return None
    if summary.get("state") == "succeeded":
        return 1.0
    if total_steps:
        return min(1.0, float(summary.get("step") or 0) / float(total_steps))
    epoch = min(w.get("epoch", 0) for w in workers)
    return min(1.0, float(epoch) / float(total_epochs or 1))


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


def state_label(summary: dict[str, Any]) -> str:
    state = str(summary.get("state", "pending"))
    if state == "restarting" or (state in ("pending", "starting") and (summary.get("attempt") or 1) > 1):
        return f"restarting (attempt {summary.get('attempt', 1) + (1 if state == 'restarting' else 0)}" \
               f"/{summary.get('max_failures', 0) + 1})"
    if state == "running" and summary.get("paused_at") is not None:
        return f"paused at step {summary['paused_at']}"
    return state


def parent_note(parent: dict[str, Any] | None) -> str:
    """The dashboard header's word on a forked run (``run.fork()``): its parent and the step it started at."""
    if not parent:
        return ""
    return f' · <span class="nbtrain-parent">forked from {html.escape(parent["run"])} at step {parent["step"]}</span>'
