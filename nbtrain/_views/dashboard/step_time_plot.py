"""The dashboard's step-time plot: per rank, a bar of milliseconds per step stacked as data wait,
compute and gradient communication (from each rank's heartbeat; see ``_cluster/rank/step_timing``).

A rank that waits for data stands out in the first colour; the ranks that wait for it, in the
last. Stragglers the supervisor flags are named under the bars. Not drawn until a rank has timed a
step (``step_timing=False``, or before the first second of steps): a run without step timing saves none.
"""

from __future__ import annotations

from typing import Any

PARTS = (("data_ms", "data wait", "#ff7f0e"), ("compute_ms", "compute", "#1f77b4"),
         ("comm_ms", "gradient communication", "#2ca02c"))
CHART_ID = "step-time"


def draw_step_times(charts: Any, workers: list[dict[str, Any]]) -> None:
    """Stacked bars of ``workers``' step times in ``charts`` (a :class:`~.charts_widget.ChartsWidget`: the
    dashboard's widget, which shows them under the worker table), once a rank has timed a step."""
    timed = [w for w in workers if w.get("step_ms") is not None]
    if not timed:
        return
    labels = [f"rank {w['rank']}" + (" (straggler)" if w.get("straggler") else "") for w in timed]
    charts.bars(CHART_ID, "time per step (ms)", labels,
                [(name, colour, [float(w.get(key) or 0.0) for w in timed]) for key, name, colour in PARTS])


def debug_hint(run_name: str, summary: dict[str, Any]) -> str:
    """For a failed run whose ranks raised: the line that opens the debugger on the first of them, as HTML."""
    if summary.get("state") != "failed":
        return ""
    raised = [f for f in summary.get("failures") or [] if f.get("kind") == "raised" and f.get("rank") is not None]
    if not raised:
        return ""
    latest = max(f["attempt"] for f in raised)
    first = next((f for f in raised if f["attempt"] == latest and not f.get("secondary")), raised[-1])
    return (f'<div class="nbtrain-debug-hint">Debug rank {first["rank"]} where it raised, with its variables: '
            f'<code>%ray_debug {run_name} --rank {first["rank"]}</code> (or <code>run.debug(rank={first["rank"]})'
            f"</code>) in a new cell.</div>")
