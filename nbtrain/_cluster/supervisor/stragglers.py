"""Stragglers: ranks whose own step time stays well above the others'.

In a DDP run every rank takes the same time per step: the fast ones wait for the slowest in
the gradient all-reduce. So a rank is compared by its *own* time per step, the step time less
its communication (data wait plus compute, from its heartbeat; see
:mod:`nbtrain._cluster.rank.inspection.step_timing`). A running rank whose own time stays above
:data:`RATIO` times the median of the running ranks' for the run's ``straggler_window_s`` is
flagged: once per episode, an event naming the rank and where its time goes, and ``straggler``
in its worker-table row (the dashboard and the sidebar show it). When it has stayed below for
as long, the flag is cleared, with an event. :class:`StragglerFlags` is the controller's callback that looks on
every watch tick.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from nbtrain._cluster.supervisor.controller_callback import ControllerCallback, RunView
from nbtrain._cluster.supervisor.failure_policy import Outcome

RATIO = 1.25


class StragglerWatch:
    """One attempt's episodes; :meth:`look` returns the events to tell."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._attempt = 0
        self._over_since: dict[int, float] = {}   # rank -> since when it is above the threshold
        self._under_since: dict[int, float] = {}  # flagged rank -> since when it is below it
        self.flagged: set[int] = set()

    def look(self, workers: list[dict[str, Any]], attempt: int, now: float | None = None
             ) -> list[tuple[int, bool, str]]:
        """(rank, flagged now, what to say) for each rank whose episode starts or ends with ``workers``."""
        now = time.monotonic() if now is None else now
        if attempt != self._attempt:  # a new attempt's ranks start unflagged
            self._attempt, self._over_since, self._under_since, self.flagged = attempt, {}, {}, set()
        own = {int(w["rank"]): own_ms(w) for w in workers if w.get("state") == "running"}
        timed = {rank: ms for rank, ms in own.items() if ms is not None}
        if len(timed) < 2:
            return []
        median = statistics.median(timed.values())
        told = []
        for rank, ms in sorted(timed.items()):
            worker = next(w for w in workers if w["rank"] == rank)
            if ms > RATIO * median:
                self._under_since.pop(rank, None)
                since = self._over_since.setdefault(rank, now)
                if rank not in self.flagged and now - since >= self.window_s:
                    self.flagged.add(rank)
                    waiting = any((w.get("comm_ms") or 0) > 1 for w in workers if w["rank"] != rank)
                    told.append((rank, True, f"Rank {rank} is a straggler: {_split(worker)} of its own per step, "
                                             f"{ms / median:.2g}× the median of the ranks ({median:.0f} ms) for "
                                             f"{self.window_s:g} s" + ("; the other ranks wait for it in their "
                                                                       "gradient all-reduce." if waiting else ".")))
            else:
                self._over_since.pop(rank, None)
                if rank in self.flagged:
                    since = self._under_since.setdefault(rank, now)
                    if now - since >= self.window_s:
                        self.flagged.discard(rank)
                        self._under_since.pop(rank, None)
                        told.append((rank, False, f"Rank {rank} is no longer a straggler: {ms:.0f} ms of its own "
                                                  f"per step against a median of {median:.0f} ms."))
        return told


class StragglerFlags(ControllerCallback):
    """Each watch tick of a run with ``step_timing``: a straggler's row is flagged (or cleared), and said."""

    def __init__(self, window_s: float) -> None:
        self._watch = StragglerWatch(window_s)

    def on_watch_tick(self, run: RunView) -> Outcome | None:
        if run.spec.options.step_timing:
            for rank, flagged, message in self._watch.look(run.table.snapshot(), run.attempt):
                run.table.note(rank, straggler=flagged)
                run.feed.event("straggler", message, run.attempt)
        return None


def own_ms(worker: dict[str, Any]) -> float | None:
    """A rank's own time per step (step less communication), in ms, or None before its first timed window."""
    step, comm = worker.get("step_ms"), worker.get("comm_ms")
    if not isinstance(step, (int, float)):
        return None
    return max(float(step) - float(comm or 0.0), 0.0)


def _split(worker: dict[str, Any]) -> str:
    own = own_ms(worker) or 0.0
    return (f"{own:.0f} ms (data wait {worker.get('data_ms') or 0:.0f} ms, compute "
            f"{worker.get('compute_ms') or 0:.0f} ms)")
