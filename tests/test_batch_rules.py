"""The arithmetic behind ``gns`` and ``adaptive_batch``, on numbers whose answer is known."""

from __future__ import annotations

import random

import pytest

from nbtrain._cluster.elastic import adaptive_batch
from nbtrain._cluster.elastic.gradient_noise import NoiseScale

pytestmark = pytest.mark.quick


def test_the_estimators_recover_a_known_noise_scale_from_exact_norms():
    # |g_b|² = |G|² + tr(Σ)/b exactly (their expectations): |G|² = 2, tr(Σ) = 50, so B_noise = 25
    noise = NoiseScale()
    for _ in range(5):
        noise.add(2 + 50 / 8, 2 + 50 / 32, 8, 32)
    assert noise.value == pytest.approx(25)


def test_the_smoothed_estimate_settles_near_the_truth_from_noisy_norms():
    rng = random.Random(0)
    noise = NoiseScale()
    for _ in range(400):
        noise.add((2 + 50 / 8) * rng.uniform(0.8, 1.2), (2 + 50 / 32) * rng.uniform(0.9, 1.1), 8, 32)
    assert 12.5 <= noise.value <= 50


def test_the_first_move_follows_the_noise_scale_and_stays_in_bounds():
    grow = adaptive_batch.choose(16, 16, (4, 64), 2, noise_scale=1000.0, step_times={16: 0.1})
    shrink = adaptive_batch.choose(16, 16, (4, 64), 2, noise_scale=2.0, step_times={16: 0.1})
    capped = adaptive_batch.choose(48, 16, (4, 64), 2, noise_scale=1e6, step_times={48: 0.1})
    assert (grow.batch_size, shrink.batch_size, capped.batch_size) == (32, 8, 64)
    assert adaptive_batch.choose(16, 16, (4, 64), 2, None, {16: 0.1}).batch_size == 16


def test_an_epoch_without_a_noise_estimate_keeps_the_batch_and_its_learning_rate_gain():
    kept = adaptive_batch.choose(45, 8, (8, 128), 2, None, {8: 0.01, 16: 0.012}, current_gain=5.3)
    assert kept == adaptive_batch.Choice(45, 5.3)  # not the starting learning rate at a 5x larger batch


def test_goodput_picks_the_larger_batch_when_steps_cost_mostly_a_fixed_time():
    # T(b) = 1 s + 0.001 s·b: the fixed cost dominates, and noise is high: the largest batch wins
    times = {8: 1.008, 16: 1.016}
    assert adaptive_batch.choose(16, 8, (4, 64), 2, 10_000.0, times).batch_size == 64
    # the per-example cost dominates and the noise is low: larger batches only waste examples
    times = {8: 0.08, 16: 0.16}
    assert adaptive_batch.choose(16, 8, (4, 64), 2, 1.0, times).batch_size == 4


def test_adascale_gain_is_between_one_and_linear():
    assert adaptive_batch.gain(8, 8, 2, 100.0) == pytest.approx(1.0)
    gain = adaptive_batch.gain(32, 8, 2, 100.0)
    assert 1.0 < gain < 4.0
    assert adaptive_batch.gain(32, 8, 2, 1e9) == pytest.approx(4.0, rel=1e-6)  # all noise: linear scaling
    assert adaptive_batch.gain(32, 8, 2, 1e-9) == pytest.approx(1.0, rel=1e-6)  # no noise: no scaling
