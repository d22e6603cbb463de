"""The step a run's files say it reached, decided where the files are read (``step_reached`` in
``nbtrain/_cluster/supervisor/stored_run.py``, by the history rules of ``nbtrain/_cluster/storage/history_rules.py``):
what ``nbtrain runs`` and the JupyterLab sidebar show for a run whose supervisor is not answering. That a run lost
with its cluster shows its last step, end to end: ``test_cli_runs.py``."""

from __future__ import annotations

from typing import Any

import pytest

from nbtrain._cluster.commands import Command
from nbtrain._cluster.supervisor.stored_run import step_reached

pytestmark = pytest.mark.quick


def rows(attempt: int, steps: list[int], ranks: int = 2, start: float = 0.0) -> list[dict[str, Any]]:
    return [{"rank": rank, "step": step, "attempt": attempt, "time": start + step, "loss": 1.0}
            for step in steps for rank in range(ranks)]


def rewind_to(step: int, rank_times: dict[int, float]) -> dict[str, Any]:
    """A rewind as the run's state file keeps its commands (JSON: a rank's time keyed by text)."""
    command = Command(id=1, kind="rewind", args={"to_step": step, "skip": 0, "attempt": 1}, at_step=9, issued=0.0,
                      applied_step=9, applied=9.5, rank_times=dict(rank_times))
    saved = command.as_dict()
    saved["rank_times"] = {str(rank): when for rank, when in rank_times.items()}
    return saved


def test_a_run_is_at_the_furthest_step_its_ranks_reported_last_however_often_each_reports():
    every_other = [row for row in rows(1, [0, 1, 2, 3]) if row["rank"] == 0 or row["step"] % 2 == 0]
    assert step_reached(every_other, []) == 3, "rank 1 reports every other step: it does not hold the run back"
    assert step_reached([], []) is None


def test_a_rewound_run_is_at_the_step_it_went_back_to_not_the_furthest_it_reached():
    rewound = rows(1, list(range(10))) + rows(1, [5, 6], start=10.0)  # went back to its step-4 checkpoint at step 9
    assert step_reached(rewound, []) == 6, "each rank's newest row, while the rewind's record is not written yet"
    assert step_reached(rewound, [rewind_to(4, {0: 9.5, 1: 9.5})]) == 6


def test_a_rank_that_has_not_reported_since_a_rewind_does_not_hold_the_run_at_its_superseded_step():
    # rank 1 reports every 8th step: its last row (step 8) is on the branch the rewind to step 4 left
    rewound = [row for row in rows(1, list(range(10))) if row["rank"] == 0 or row["step"] % 8 == 0] \
        + rows(1, [5, 6], ranks=1, start=10.0)
    assert step_reached(rewound, [rewind_to(4, {0: 9.5, 1: 9.5})]) == 6, "rank 1's step 8 was superseded"


def test_a_new_attempt_counts_alone_even_with_a_late_row_of_the_one_before():
    restarted = rows(1, list(range(10))) + rows(2, [8], ranks=1, start=20.0)  # resumed at 8, rank 1 not yet there
    assert step_reached(restarted, []) == 8
    late = {"rank": 1, "step": 9, "attempt": 1, "time": 9.0}
    assert step_reached([*restarted, late], []) == 8, "attempt 1's last flush, late"
