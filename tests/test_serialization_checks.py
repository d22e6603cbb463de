"""What a run would send to its workers is checked first, and a value that cannot go is named (no cluster needed).

The end-to-end path (``launch()`` refusing before any worker starts) is in
test_run_failures.py and test_magic_runs.py.
"""

from __future__ import annotations

import threading

import cloudpickle
import pytest

from nbtrain import NotSerializableError
from nbtrain._client.launching.serialization import check_values, dumps_checked

pytestmark = pytest.mark.quick


def test_a_function_that_can_be_sent_round_trips():
    scale = 3

    def train(config):
        return config["x"] * scale

    assert cloudpickle.loads(dumps_checked(train)[0])({"x": 2}) == 6


def test_a_lock_in_the_closure_is_named_with_its_type():
    lock = threading.Lock()

    def train(config):
        with lock:
            return config

    with pytest.raises(NotSerializableError, match=r"^`lock` \(a threading.Lock\) cannot be sent to the workers"):
        dumps_checked(train)


def test_a_lock_reached_through_a_helper_function_is_named():
    guard = threading.Lock()

    def helper():
        with guard:
            return 1

    def train(config):
        return helper()

    with pytest.raises(NotSerializableError, match=r"^`guard` \(a threading.Lock\)"):
        dumps_checked(train)


def test_a_cells_captured_names_are_checked_by_name():
    check_values({"lr": 0.1, "layers": [64, 32]})
    with pytest.raises(NotSerializableError, match=r"^`guard` \(a threading.Lock\) cannot be sent"):
        check_values({"lr": 0.1, "guard": threading.Lock()})
    event = threading.Event()

    def step():
        return event.is_set()

    with pytest.raises(NotSerializableError, match=r"^`step` → `event`"):
        check_values({"step": step})
