"""The dashboard's step-time plot: per rank, a bar of milliseconds per step stacked as data wait,
compute and gradient communication (from each rank's heartbeat; see ``_cluster/rank/step_timing``).

A rank that waits for data stands out in the first colour; the ranks that wait for it, in the
last. Stragglers the supervisor flags are named under the bars. Hidden until a rank has timed a
step (``step_timing=False``, or before the first second of steps).
"""

from __future__ import annotations

from typing import Any

PARTS = (("data_ms", "data wait", "#ff7f0e"), ("compute_ms", "compute", "#1f77b4"),
         ("comm_ms", "gradient communication", "#2ca02c"))


class StepTimePlot:
    """A plotly FigureWidget of stacked bars, updated in place (never re-displayed)."""

    def __init__(self) -> None:
        import ipywidgets as w

        self.widget = w.Box(layout=w.Layout(display="none"))
        self.figure: Any = None

    def draw(self, workers: list[dict[str, Any]]) -> None:
        timed = [w for w in workers if w.get("step_ms") is not None]
        if not timed:
            return
        labels = [f"rank {w['rank']}" + (" (straggler)" if w.get("straggler") else "") for w in timed]
        if self.figure is None:
            import plotly.graph_objects as go

            self.figure = go.FigureWidget(
                data=[go.Bar(x=labels, y=[w.get(key) or 0.0 for w in timed], name=name, marker_color=colour)
                      for key, name, colour in PARTS],
                layout=dict(title=dict(text="time per step (ms)", x=0.02), barmode="stack", height=260, width=460,
                            margin=dict(l=50, r=10, t=40, b=40), legend=dict(font=dict(size=10))))
            self.widget.children = (self.figure,)
            self.widget.layout.display = None
            return
        with self.figure.batch_update():
            for trace, (key, _name, _colour) in zip(self.figure.data, PARTS):
                trace.x, trace.y = labels, [w.get(key) or 0.0 for w in timed]


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
