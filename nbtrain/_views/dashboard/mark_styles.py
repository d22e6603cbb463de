"""How each kind of mark (:class:`~nbtrain._client.run.run_history.Mark`) is drawn, in every picture: the charts
widget, the static SVG, the plotly figures. One table, so a rewind looks the same everywhere. Marks are a run's
history's (changes, rewinds, resizes, restarts, guard trips), and a sweep's ASHA rungs (:data:`RUNG`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from nbtrain._client.run.run_history import GUARD_TRIP, RESIZE, RESTART, Mark
from nbtrain._cluster.commands import REWIND


class MarkStyle(NamedTuple):
    colour: str
    dash: str      # "dot" or "dash"


RUNG = "rung"  # a sweep's ASHA milestone, where trials below the best fraction are stopped

CHANGE = MarkStyle("#2ca02c", "dot")   # a change of the run's settings or code (adjust, patch, pause, exec...)
STYLES = {
    REWIND: MarkStyle("#d62728", "dot"),
    GUARD_TRIP: MarkStyle("#9467bd", "dot"),
    RESIZE: MarkStyle("#ff7f0e", "dash"),
    RESTART: MarkStyle("#7f7f7f", "dash"),
    RUNG: MarkStyle("#999999", "dash"),
}


def style_of(mark: Mark) -> MarkStyle:
    return STYLES.get(mark.kind, CHANGE)


def widget_marks(marks: Sequence[Mark]) -> list[dict[str, object]]:
    """The marks as the charts widget takes them (``static/charts.js``)."""
    return [{"x": mark.step, "text": mark.label, "color": style_of(mark).colour, "dash": style_of(mark).dash,
             "kind": mark.kind} for mark in marks]
