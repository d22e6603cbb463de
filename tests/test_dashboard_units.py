"""Downsampling, metric grouping, progress and the static summary (no cluster needed)."""

from __future__ import annotations

import numpy as np
import pytest

from nbtrain._views.dashboard import progress_fraction, state_label
from nbtrain._views.downsample import downsample
from nbtrain._views.history import MetricHistory
from nbtrain._views.static_plot import svg_chart

pytestmark = pytest.mark.quick


def test_downsampling_keeps_first_last_and_extremes():
    xs = np.arange(1_000_000, dtype=float)
    ys = np.sin(xs / 5000.0)
    ys[123_456] = 50.0      # a spike
    ys[654_321] = -40.0     # a dip
    dx, dy = downsample(xs, ys, max_points=2000)
    assert len(dx) <= 2000
    assert dx[0] == 0 and dx[-1] == 999_999
    assert dy.max() == 50.0 and dx[dy.argmax()] == 123_456
    assert dy.min() == -40.0 and dx[dy.argmin()] == 654_321
    assert np.all(np.diff(dx) > 0)


def test_short_series_are_untouched():
    dx, dy = downsample([1, 2, 3], [3.0, 1.0, 2.0], max_points=10)
    assert list(dx) == [1, 2, 3] and list(dy) == [3.0, 1.0, 2.0]


def test_history_groups_losses_and_accuracies_and_averages_ranks():
    history = MetricHistory()
    history.add([{"rank": r, "step": s, "attempt": 1, "time": 0.0, "loss": float(s + r), "val_loss": 1.0,
                  "accuracy": 0.5, "lr": 0.1} for s in range(1, 4) for r in (0, 1)])
    assert history.groups() == {"accuracy": ["accuracy"], "loss": ["loss", "val_loss"], "lr": ["lr"]}
    steps, mean = history.mean("loss")
    assert list(steps) == [1, 2, 3] and list(mean) == [1.5, 2.5, 3.5]


def test_a_restart_replaces_the_overlapping_tail():
    history = MetricHistory()
    history.add([{"rank": 0, "step": s, "attempt": 1, "time": 0.0, "loss": 1.0} for s in range(10)])
    history.add([{"rank": 0, "step": s, "attempt": 2, "time": 0.0, "loss": 2.0} for s in range(6, 12)])
    xs, ys = history.per_rank("loss")[0]
    assert list(xs) == list(range(12))
    assert list(ys) == [1.0] * 6 + [2.0] * 6


def test_progress_and_state_labels():
    assert progress_fraction({"total_steps": 200, "step": 50}) == 0.25
    assert progress_fraction({"total_epochs": 4, "workers": [{"epoch": 1}, {"epoch": 2}]}) == 0.25
    assert progress_fraction({}) is None
    assert state_label({"state": "restarting", "attempt": 1, "max_failures": 2}) == "restarting (attempt 2/3)"
    assert state_label({"state": "running", "attempt": 1}) == "running"


def test_static_chart_is_a_small_svg_with_the_series_names():
    xs = np.arange(100_000, dtype=float)
    svg = svg_chart("loss", {"loss mean": (xs, 1 / (xs + 1))})
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "loss mean" in svg
    assert len(svg) < 20_000
