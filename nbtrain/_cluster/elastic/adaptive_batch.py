"""Which per-rank batch size trains fastest, from the gradient noise scale and measured step times.

Pollux's rule (Qiao et al., OSDI 2021, as AdaptDL implements it): pick the batch
that maximises *goodput* = throughput x statistical efficiency. With ``M0`` the
global batch the run started with and ``φ`` the gradient noise scale
(:mod:`~nbtrain._cluster.elastic.gradient_noise`), one example at global batch ``M`` does
``E(M) = (φ + M0) / (φ + M)`` of the progress it did at ``M0``; throughput is
``N·b / T(b)`` examples per second, with the step time modelled as
``T(b) = a + c·b`` (fixed cost — the all-reduce, Python — plus per example)
and fitted to the step times seen at each size.

Until two sizes have been timed the fit has nothing to go on, so the first move
goes the way the noise scale points (McCandlish et al. 2018): larger while the
global batch is below ``φ`` (the gradient is mostly noise: bigger batches still
pay), smaller above it.

The learning rate follows AdaScale's gain (Johnson et al., ICML 2020), which for
batch ``M`` against ``M0`` is ``r = (φ/M0 + 1) / (φ/M + 1)``: between 1 and
``M/M0``, linear scaling while noise dominates, none once it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

SIZES_PER_OCTAVE = 2  # candidate batch sizes: powers of √2 between the bounds (and the bounds)


@dataclass(frozen=True)
class Choice:
    batch_size: int
    lr_gain: float   # AdaScale's gain at this size against the starting one


def choose(current: int, initial: int, bounds: tuple[int, int], world_size: int, noise_scale: float | None,
           step_times: dict[int, float], current_gain: float = 1.0) -> Choice:
    """The per-rank batch size to train the next epoch with, and its learning-rate gain.

    ``step_times`` maps each per-rank batch size tried to its mean step time (seconds,
    the same on every rank: averaged over the ranks), ``noise_scale`` is ``φ`` in examples.
    With no estimate this epoch (a noisy ``|G|²`` at or below 0) the batch and the gain it
    trains with (``current_gain``) are both kept: the learning rate stays matched to the batch.
    """
    low, high = bounds
    if noise_scale is None:
        return Choice(current, current_gain)
    fit = _fit(step_times)
    if fit is None:  # one size timed: step the way the noise scale points
        target = current * 2 if noise_scale > current * world_size else current // 2
        size = min(max(target, low), high)
    else:
        alpha, beta = fit
        size = max(_candidates(low, high, current),
                   key=lambda b: goodput(b, world_size, initial, noise_scale, alpha, beta))
    return Choice(size, gain(size, initial, world_size, noise_scale))


def goodput(batch: int, world_size: int, initial: int, noise_scale: float, alpha: float, beta: float) -> float:
    """Examples of progress per second (in units of an example at the starting batch)."""
    global_batch, start = batch * world_size, initial * world_size
    throughput = global_batch / max(alpha + beta * batch, 1e-9)
    return throughput * (noise_scale + start) / (noise_scale + global_batch)


def gain(batch: int, initial: int, world_size: int, noise_scale: float | None) -> float:
    """AdaScale's learning-rate gain for per-rank ``batch`` against ``initial`` (1 while φ is unknown)."""
    if noise_scale is None:
        return 1.0
    return (noise_scale / (initial * world_size) + 1) / (noise_scale / (batch * world_size) + 1)


def _fit(step_times: dict[int, float]) -> tuple[float, float] | None:
    """Least squares ``T(b) = a + c·b`` over the sizes tried (both kept ≥ 0); None below two sizes."""
    if len(step_times) < 2:
        return None
    sizes, times = list(step_times), list(step_times.values())
    n = len(sizes)
    mean_b, mean_t = sum(sizes) / n, sum(times) / n
    spread = sum((b - mean_b) ** 2 for b in sizes)
    beta = max(sum((b - mean_b) * (t - mean_t) for b, t in zip(sizes, times)) / spread, 0.0)
    alpha = max(mean_t - beta * mean_b, 0.0)
    return alpha, beta


def _candidates(low: int, high: int, current: int) -> list[int]:
    sizes = {low, high, current}
    size = float(low)
    while size < high:
        sizes.add(round(size))
        size *= 2 ** (1 / SIZES_PER_OCTAVE)
    return sorted(s for s in sizes if low <= s <= high)
