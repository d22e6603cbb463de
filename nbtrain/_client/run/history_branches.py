"""A run's history across rewinds: which rewinds a summary records, and which metric rows belong to a branch
a rewind went back from (*superseded*: faded on the dashboard, the ``superseded`` column of
``run.metrics_frame()``). Pure functions of what was read, shared by the reader, the files and ``run.rewinds``.
"""

from __future__ import annotations

from typing import Any

from nbtrain._cluster.commands import REWIND


def rewinds_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The rewinds among a summary's ``changes`` (see :attr:`RunRewinds.rewinds`)."""
    return [{"to_step": change["args"]["to_step"], "skip": change["args"].get("skip", 0),
             "step": change.get("applied_step"), "why": change["args"].get("why"),
             "attempt": change["args"].get("attempt"), "superseded": bool(change.get("superseded")),
             "rank_times": {int(rank): when for rank, when in (change.get("rank_times") or {}).items()},
             "description": change["description"]}
            for change in summary.get("changes") or [] if change["kind"] == REWIND]


def superseded(row: dict[str, Any], rewinds: list[dict[str, Any]]) -> bool:
    """Whether a metric row belongs to a branch a rewind went back from: reported past the rewind's restore
    point, before its rank went back (by that rank's own clock)."""
    rank = row.get("rank")
    for rewind in rewinds:
        went_back = rewind["rank_times"].get(rank)
        if went_back is not None and row["step"] > rewind["to_step"] and row["time"] < went_back:
            return True
    return False


def superseded_column(frame: Any, rewinds: list[dict[str, Any]]) -> Any:
    """:func:`superseded` for every row of a metrics frame, as a boolean array (vectorised)."""
    import numpy as np

    mask = np.zeros(len(frame), dtype=bool)
    if not len(frame):
        return mask
    ranks, steps, times = frame["rank"].to_numpy(), frame["step"].to_numpy(), frame["time"].to_numpy()
    for rewind in rewinds:
        for rank, went_back in rewind["rank_times"].items():
            mask |= (ranks == rank) & (steps > rewind["to_step"]) & (times < went_back)
    return mask

