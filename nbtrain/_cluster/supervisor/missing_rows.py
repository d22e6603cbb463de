"""Rows that never reached the run's history, said as notes at an attempt's end, so no row goes missing unsaid:
pushes a rank sent that never landed, rows its last flush could not send, and a run whose code reports nothing
nbtrain sees (unchanged code may log nowhere nbtrain sees: the dashboard then has no curves)."""

from __future__ import annotations

from nbtrain._cluster.supervisor.attempt import AttemptGroup
from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.failure_policy import Outcome, Succeeded

# said once, at the end of the first attempt whose ranks sent no metric row: unchanged code may log nowhere nbtrain sees
NO_ROWS_NOTE = ("No metric rows came from this run: its code reports nothing nbtrain sees, so the dashboard has no "
                "curves (the ranks' logs are there). For live curves call nbtrain.report(loss=...) in the training "
                "loop, or write scalars with torch.utils.tensorboard.SummaryWriter(...).add_scalar(tag, value, step): "
                "each rank's become its rows.")
NO_ROWS_AFTER_S = 60.0  # a stopped or failed attempt shorter than this had no time to report: it gets no such note
FINAL_PUSHES_IDLE_S = 15.0  # give up on a rank's missing pushes after this long without one


def lost_pushes_note(rank: int, pushes: int) -> str:
    """What a rank's pushes that were sent and never arrived mean: an event, so no row goes missing unsaid."""
    return (f"Rank {rank}'s last {pushes} push{'es' if pushes != 1 else ''} of metric rows and log lines were sent "
            f"but never reached the run's supervisor ({FINAL_PUSHES_IDLE_S:g} s after the rank ended): the run's "
            "history lacks what they held. A busy or lost head node does this; its rows before them are all there.")


def unsent_note(rank: int, unsent: dict[str, float]) -> str:
    """What a rank's outcome says its last flush could not send: an event, so no row goes missing unsaid."""
    return (f"Rank {rank}'s last {unsent['rows']:.0f} metric rows and {unsent['logs']:.0f} log chunks never reached "
            f"the run's supervisor: it took none of the rank's pushes within {unsent['wait_s']:g} s as the rank ended "
            "(a busy head node). Report every few steps rather than every step, or give the head node more CPU.")


def no_rows_note_due(outcome: Outcome, ran_s: float, rows: int, said_before: bool) -> bool:
    """Whether :data:`NO_ROWS_NOTE` is true of an attempt that sent ``rows`` rows in ``ran_s`` s of running: its
    code returned without reporting, or it ran ``NO_ROWS_AFTER_S`` before it was stopped or failed (a run stopped
    3 s in, its kernel shut down, had not reached its first ``report()``)."""
    if rows or said_before:
        return False
    return isinstance(outcome, Succeeded) or ran_s >= NO_ROWS_AFTER_S


class UnsentRows(ControllerCallback):
    def on_attempt_end(self, run: RunView, outcome: Outcome, group: AttemptGroup, ran_s: float) -> None:
        """Pushes travel beside the outcome: the last rows land before readers see the end, or are said lost."""
        lost = run.feed.wait_for_pushes(run.attempt, group.pushes, FINAL_PUSHES_IDLE_S)
        for rank, pushes in sorted(lost.items()):
            run.feed.event("note", lost_pushes_note(rank, pushes), run.attempt)
        for rank, unsent in sorted(group.unsent.items()):
            if unsent["rows"] or unsent["logs"]:
                run.feed.event("note", unsent_note(rank, unsent), run.attempt)


class NoRowsNote(ControllerCallback):
    """After :class:`UnsentRows` in the callbacks' order: the rows still on their way count."""

    def on_attempt_end(self, run: RunView, outcome: Outcome, group: AttemptGroup, ran_s: float) -> None:
        if no_rows_note_due(outcome, ran_s, run.feed.row_count,
                            any(e["message"] == NO_ROWS_NOTE for e in run.feed.events)):
            run.feed.event("note", NO_ROWS_NOTE, run.attempt)
