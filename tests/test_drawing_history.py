"""What the dashboard keeps of a long run for drawing: bounded, exact where recent, spikes kept (no cluster)."""

from __future__ import annotations

import numpy as np
import pytest

from nbtrain._views.dashboard.downsample import downsample
from nbtrain._views.dashboard.history import EXACT_POINTS, MAX_BUCKETS, SPILL_POINTS, MetricHistory

pytestmark = pytest.mark.quick

BOUND = EXACT_POINTS + SPILL_POINTS + 4 * MAX_BUCKETS  # points held per metric and rank, at most


def feed(history: MetricHistory, steps: range, batch: int = 5000, rank: int = 0, attempt: int = 1,
         value=lambda s: 1.0 / (s + 1), spikes: dict[int, float] | None = None) -> None:
    spikes = spikes or {}
    for start in range(steps.start, steps.stop, batch):
        history.add([{"rank": rank, "step": s, "attempt": attempt, "time": 0.0, "loss": spikes.get(s, value(s))}
                     for s in range(start, min(start + batch, steps.stop))])


@pytest.fixture(scope="module")
def million() -> MetricHistory:
    history = MetricHistory()
    feed(history, range(1_000_000), spikes={500_000: 1e6, 123_457: -50.0})
    return history


def test_a_million_points_are_held_in_a_fixed_number_of_points(million):
    short = MetricHistory()
    feed(short, range(100_000))
    assert million.rows_seen == 1_000_000
    assert million.stored_points() <= BOUND
    assert million.nbytes <= short.nbytes  # the arrays do not grow with the run, they only fill up


def test_a_single_spike_anywhere_is_on_the_drawn_curve(million):
    xs, ys = million.points("loss", 0)
    assert len(xs) <= 2000 and np.all(np.diff(xs) > 0)
    assert ys.max() == 1e6 and xs[ys.argmax()] == 500_000
    assert ys.min() == -50.0 and xs[ys.argmin()] == 123_457
    steps, _mean, low, high = million.band("loss")
    assert high.max() == 1e6 and low.min() == -50.0 and len(steps) <= 2000
    assert xs[0] == 0 and xs[-1] == 999_999


def test_recent_steps_are_exact(million):
    xs, ys = million.points("loss", 0)
    recent = np.arange(999_000, 1_000_000)
    assert np.array_equal(xs[-1000:], recent) and np.array_equal(ys[-1000:], 1.0 / (recent + 1))
    wide_xs, _ = million.points("loss", 0, max_points=2 * EXACT_POINTS)  # all the exact tier, when asked
    assert np.array_equal(wide_xs[-EXACT_POINTS:], np.arange(1_000_000 - EXACT_POINTS, 1_000_000))
    steps, mean, _, _ = million.band("loss")
    assert np.array_equal(steps[-1000:], recent) and np.allclose(mean[-1000:], 1.0 / (recent + 1))


def test_a_restart_replaces_the_overlapping_tail_in_the_exact_points():
    history = MetricHistory()
    feed(history, range(10), value=lambda s: 1.0)
    feed(history, range(6, 12), attempt=2, value=lambda s: 2.0)
    xs, ys = history.points("loss", 0)
    assert list(xs) == list(range(12)) and list(ys) == [1.0] * 6 + [2.0] * 6
    steps, mean, _, _ = history.band("loss")
    assert list(steps) == list(range(12)) and list(mean) == [1.0] * 6 + [2.0] * 6


def test_a_restart_from_long_ago_cuts_into_the_buckets_and_keeps_the_curve_in_order():
    history = MetricHistory()
    feed(history, range(200_000), value=lambda s: 1.0)
    feed(history, range(50_000, 60_000), attempt=2, value=lambda s: 3.0)
    xs, ys = history.points("loss", 0)
    assert np.all(np.diff(xs) > 0) and xs[-1] == 59_999
    assert set(ys[xs >= 50_000]) == {3.0} and set(ys[xs < 50_000]) == {1.0}
    assert history.stored_points() <= BOUND
    steps, mean, _, _ = history.band("loss")
    # the band's bins are a few hundred steps wide by now: the one holding step 50,000 mixes both attempts
    assert steps[-1] == 59_999 and set(mean[steps >= 51_000]) == {3.0} and set(mean[steps < 49_000]) == {1.0}


def test_a_restart_inside_one_batch_is_replaced_too():
    history = MetricHistory()
    history.add([{"rank": 0, "step": s, "loss": 1.0} for s in range(5)]
                + [{"rank": 0, "step": s, "loss": 2.0} for s in range(3, 7)])
    xs, ys = history.points("loss", 0)
    assert list(xs) == list(range(7)) and list(ys) == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_text_and_true_false_go_to_text_and_numbers_to_latest():
    history = MetricHistory()
    history.add([{"rank": 0, "step": 1, "loss": 0.5, "phase": "warmup", "done": False},
                 {"rank": 1, "step": 1, "loss": 0.7, "phase": None, "extra": [1, 2]},
                 {"rank": 0, "step": 2, "loss": 0.4, "phase": "train", "done": True}])
    assert history.text == {0: {"phase": "train", "done": "True"}}
    assert history.latest == {"loss": 0.4}
    assert history.metrics == ["loss"] and history.ranks() == [0, 1]


def test_many_ranks_are_held_in_bounded_memory_and_averaged_per_step():
    history = MetricHistory()
    for step in range(3000):
        history.add([{"rank": r, "step": step, "loss": float(r)} for r in range(64)])
    assert history.stored_points() <= 64 * BOUND
    _steps, mean, low, high = history.band("loss")
    assert np.all(mean == 31.5) and np.all(low == 0.0) and np.all(high == 63.0)
    xs, ys = history.points("loss", 40)
    assert xs[-1] == 2999 and np.all(ys == 40.0)


def test_a_lagging_rank_still_lands_in_the_band():
    history = MetricHistory()
    history.add([{"rank": 0, "step": s, "loss": 1.0} for s in range(5000)])
    history.add([{"rank": 1, "step": s, "loss": 3.0} for s in range(100)])  # far behind the recent window
    steps, mean, _low, high = history.band("loss")
    assert high[steps < 100].max() == 3.0 and mean[-1] == 1.0


def test_downsampling_ignores_nan_and_inf_for_extremes():
    ys = np.ones(10_000)
    ys[10:20] = np.nan
    ys[5000] = np.inf
    ys[7000] = 4.0
    xs, drawn = downsample(np.arange(10_000), ys, 100)
    assert len(xs) <= 100 and 4.0 in drawn and 7000 in xs
