"""A run's lifecycle: the moves a run may make, and the ones the supervisor refuses (no cluster needed)."""

from __future__ import annotations

import itertools

import pytest

from nbtrain import RunState
from nbtrain._states import check_transition

pytestmark = pytest.mark.quick

ENDED = (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)
LIVE = tuple(state for state in RunState if state not in ENDED)


def test_a_run_that_restarts_and_then_succeeds_makes_only_legal_moves():
    path = [RunState.PENDING, RunState.STARTING, RunState.RUNNING, RunState.RESTARTING, RunState.PENDING,
            RunState.STARTING, RunState.RUNNING, RunState.SUCCEEDED]
    for current, new in itertools.pairwise(path):
        check_transition(current, new)


def test_only_succeeded_failed_and_stopped_are_terminal():
    assert [state for state in RunState if state.is_terminal] == list(ENDED)


@pytest.mark.parametrize("live", LIVE)
def test_a_live_run_can_always_be_stopped_or_fail(live):
    check_transition(live, RunState.STOPPED)
    check_transition(live, RunState.FAILED)


@pytest.mark.parametrize("ended", ENDED)
def test_an_ended_run_never_moves_again(ended):
    for new in RunState:
        with pytest.raises(RuntimeError, match=f"illegal run state transition {ended.value} -> {new.value}"):
            check_transition(ended, new)


@pytest.mark.parametrize("early", [RunState.PENDING, RunState.STARTING, RunState.RESTARTING])
def test_a_run_cannot_succeed_before_it_has_run(early):
    with pytest.raises(RuntimeError, match=f"{early.value} -> succeeded"):
        check_transition(early, RunState.SUCCEEDED)
