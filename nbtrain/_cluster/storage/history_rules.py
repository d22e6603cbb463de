"""Which of a run's metric rows count: the branches its rewinds left and the rows a later attempt replaced.

Decided once, here, for every process that reads a run's rows: the notebook's history model
(:mod:`nbtrain._client.run.run_history`: ``run.metrics_frame()``, ``run.on_row``, the dashboard, ``compare()``
and the figures), the head's reading of a run's files (``stored_run.step_reached``: the step ``nbtrain runs``
and the JupyterLab sidebar show) and a sweep's trial table (:mod:`nbtrain._cluster.sweep.trial_curve`: the curves
the sweep dashboard draws). The rules read only what a run records (its rewind commands with each rank's clock
as it went back, each row's rank, step, attempt and time), so every reader agrees.

- **Branches** (:class:`Branch`): a rewind supersedes the rows each rank reported past the step it went back
  to, before that rank went back (by the rank's own clock, recorded as it went back). A row of a rank whose
  going back is not recorded yet is not superseded (yet): :meth:`Branch.waits_for` says which ranks a
  rewind under way still has to hear from, so a live reader can hold such rows back.
- **Replaced rows**: a new attempt (a restart, a resize, a resume) resumes from a checkpoint; the rows earlier
  attempts reported from the step it resumed at on no longer count (:func:`attempt_starts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from nbtrain._cluster.command_kinds.table import command_kind

Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Branch:
    """What one rewind left: every rank's rows past ``to_step`` reported before that rank went back."""

    to_step: int                                  # the checkpoint's step the ranks went back to
    rank_times: Mapping[int, float]               # rank -> when it went back, by its own clock
    step: int | None = None                       # where rank 0 was when it went back (None: under way)
    attempt: int | None = None
    skip: int = 0
    why: str | None = None                        # a guard's trip, or None for run.rewind()
    superseded: bool = False                      # a later rewind went back before it
    dropped: bool = False                         # it never applied (its attempt ended first)
    description: str = ""

    def holds(self, rank: int, step: float, time: float) -> bool:
        """Whether the row of ``rank`` at ``step`` reported at ``time`` belongs to this branch."""
        went_back = self.rank_times.get(rank)
        return went_back is not None and step > self.to_step and time < went_back

    def mask(self, ranks: npt.NDArray[Any], steps: npt.NDArray[Any], times: npt.NDArray[Any]) -> Bools:
        """:meth:`holds` for columns of rows."""
        held = np.zeros(len(ranks), dtype=bool)
        past = steps > self.to_step
        for rank, went_back in self.rank_times.items():
            held |= (ranks == rank) & past & (times < went_back)
        return held

    def waits_for(self, rank: int) -> bool:
        """Whether ``rank`` has still to go back (its rows past ``to_step`` may yet turn out superseded)."""
        return not self.dropped and rank not in self.rank_times

    def as_dict(self) -> dict[str, Any]:
        """As ``run.rewinds`` lists it."""
        return {"to_step": self.to_step, "skip": self.skip, "step": self.step, "why": self.why,
                "attempt": self.attempt, "superseded": self.superseded, "rank_times": dict(self.rank_times),
                "description": self.description}


def branches_of(summary: Mapping[str, Any]) -> tuple[Branch, ...]:
    """The branches a run's rewinds left, in order, from its summary's ``changes`` (a kind that goes back)."""
    return branches_of_commands(summary.get("changes") or [])


def branches_of_commands(commands: Iterable[Mapping[str, Any]]) -> tuple[Branch, ...]:
    """The branches a run's rewinds left, in order, from its commands as a summary's ``changes`` or its saved
    state's ``commands`` list them (other kinds are passed over; a rank's time may be keyed by text, as JSON
    keeps it)."""
    found = []
    for change in commands:
        if not command_kind(change["kind"]).goes_back:
            continue
        args = change["args"]
        found.append(Branch(
            to_step=int(args["to_step"]), skip=int(args.get("skip") or 0), step=change.get("applied_step"),
            why=args.get("why"), attempt=args.get("attempt"), superseded=bool(change.get("superseded")),
            dropped=change.get("dropped") is not None,
            rank_times={int(rank): float(when) for rank, when in (change.get("rank_times") or {}).items()},
            description=change.get("description", "")))
    return tuple(found)


def superseded_mask(branches: Sequence[Branch], ranks: npt.NDArray[Any], steps: npt.NDArray[Any],
                    times: npt.NDArray[Any]) -> Bools:
    """Which rows belong to a branch some rewind went back from."""
    held = np.zeros(len(ranks), dtype=bool)
    for branch in branches:
        held |= branch.mask(ranks, steps, times)
    return held


def branch_of_rows(branches: Sequence[Branch], ranks: npt.NDArray[Any], steps: npt.NDArray[Any],
                   times: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """For each row, the index of the first branch holding it (-1: none): each row is drawn with one branch."""
    found = np.full(len(ranks), -1, dtype=np.int64)
    for index, branch in enumerate(branches):
        found[(found < 0) & branch.mask(ranks, steps, times)] = index
    return found


def attempt_starts(attempts: npt.NDArray[Any], steps: npt.NDArray[Any]) -> dict[int, int]:
    """Each attempt after the first -> the step its rows begin at (where it resumed from its checkpoint)."""
    if not len(attempts):
        return {}
    order = np.argsort(attempts, kind="stable")
    kinds, first = np.unique(attempts[order], return_index=True)
    lowest = np.minimum.reduceat(steps[order], first)
    return {int(a): int(s) for a, s in zip(kinds, lowest) if a != kinds[0]}


def replaced_mask(attempts: npt.NDArray[Any], steps: npt.NDArray[Any], starts: Mapping[int, int]) -> Bools:
    """Rows a later attempt replaced: reported at or past the step it resumed from."""
    replaced = np.zeros(len(attempts), dtype=bool)
    for attempt, start in starts.items():
        replaced |= (attempts < attempt) & (steps >= start)
    return replaced


def left_out(branches: Sequence[Branch], ranks: npt.NDArray[Any], steps: npt.NDArray[Any],
             attempts: npt.NDArray[Any], times: npt.NDArray[Any]) -> Bools:
    """Which rows no longer count: a rewind superseded them, or a later attempt replaced them."""
    return superseded_mask(branches, ranks, steps, times) | replaced_mask(attempts, steps,
                                                                          attempt_starts(attempts, steps))
