"""The suite's own shape: which lane and tier a test runs in follows from what it uses (issue 56)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

TESTS = Path(__file__).resolve().parent


def test_no_test_marks_the_cluster_by_hand():
    """``cluster`` is set by tests/conftest.py from the ``cluster`` fixture: a hand-kept marker drifted (38 tests
    carried it without using the cluster, 19 used it without)."""
    marked = [f"{path.name}:{number}" for path in sorted(TESTS.glob("test_*.py"))
              for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if re.search(r"pytest\.mark\.cluster\b", line)]
    assert marked == [], f"drop these markers (the fixture sets it): {marked}"


def test_the_marker_follows_the_fixture(request: pytest.FixtureRequest):
    assert request.node.get_closest_marker("cluster") is None
