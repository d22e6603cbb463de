"""The step a run's files say it reached, decided where the files are read (``step_reached`` in
``nbtrain/_cluster/supervisor/stored_run.py``): what ``nbtrain runs`` and the JupyterLab sidebar show for a run
whose supervisor is not answering. That a run lost with its cluster shows its last step, end to end:
``test_cli_runs.py``."""

from __future__ import annotations

from typing import Any

import pytest

from nbtrain._cluster.supervisor.stored_run import step_reached

pytestmark = pytest.mark.quick


def rows(attempt: int, steps: list[int], ranks: int = 2) -> list[dict[str, Any]]:
    return [{"rank": rank, "step": step, "attempt": attempt, "loss": 1.0} for step in steps for rank in range(ranks)]


def test_a_run_is_at_the_furthest_step_its_ranks_reported_last_however_often_each_reports():
    every_other = [row for row in rows(1, [0, 1, 2, 3]) if row["rank"] == 0 or row["step"] % 2 == 0]
    assert step_reached(every_other) == 3, "rank 1 reports every other step: it does not hold the run back"
    assert step_reached([]) is None


def test_a_rewound_run_is_at_the_step_it_went_back_to_not_the_furthest_it_reached():
    rewound = rows(1, list(range(10))) + rows(1, [5, 6])  # went back to its step-4 checkpoint at step 9
    assert step_reached(rewound) == 6, "the rows past step 4 before the rewind are superseded"


def test_a_new_attempt_counts_alone_even_with_a_late_row_of_the_one_before():
    restarted = rows(1, list(range(10))) + rows(2, [8], ranks=1)  # resumed at step 8, rank 1 not yet reported
    assert step_reached(restarted) == 8
    assert step_reached([*restarted, {"rank": 1, "step": 9, "attempt": 1}]) == 8, "attempt 1's last flush, late"
