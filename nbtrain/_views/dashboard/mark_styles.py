"""How each kind of mark of a run's history (:class:`~nbtrain._client.run.run_history.Mark`) is drawn, in every
picture of it: the charts widget, the static SVG, the plotly figures. One table, so a rewind looks the same
everywhere."""

from __future__ import annotations

from typing import NamedTuple

from nbtrain._client.run.run_history import GUARD_TRIP, RESIZE, RESTART, Mark
from nbtrain._cluster.commands import REWIND


class MarkStyle(NamedTuple):
    colour: str
    dash: str      # "dot" or "dash"


CHANGE = MarkStyle("#2ca02c", "dot")   # a change of the run's settings or code (adjust, patch, pause, exec...)
STYLES = {
    REWIND: MarkStyle("#d62728", "dot"),
    GUARD_TRIP: MarkStyle("#9467bd", "dot"),
    RESIZE: MarkStyle("#ff7f0e", "dash"),
    RESTART: MarkStyle("#7f7f7f", "dash"),
}


def style_of(mark: Mark) -> MarkStyle:
    return STYLES.get(mark.kind, CHANGE)


def widget_marks(marks: list[Mark]) -> list[dict[str, object]]:
    """The marks as the charts widget takes them (``static/charts.js``)."""
    return [{"x": mark.step, "text": mark.label, "color": style_of(mark).colour, "dash": style_of(mark).dash,
             "kind": mark.kind} for mark in marks]
