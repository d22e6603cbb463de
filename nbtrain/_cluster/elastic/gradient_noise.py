"""The gradient noise scale of a DDP run, measured from the gradients DDP already has.

Why: the largest batch that still trains efficiently is about the *gradient noise
scale* ``B_noise = tr(Σ) / |G|²`` (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"): ``Σ`` is the covariance of one example's gradient and ``G``
the true gradient. Below it larger batches buy nearly linear speed-up, above it
little. AdaptDL / Pollux (Qiao et al., OSDI 2021) use it to pick the batch size.

How: DDP holds, for every bucket of gradients, this rank's local gradient (a mean
over ``b`` examples) before the all-reduce and the average over all ``N`` ranks
(``N·b`` examples) after it. A communication hook takes the squared norm of both
— one extra pass over each bucket, no extra collective — and McCandlish's
unbiased estimators (their appendix A.1) turn them into estimates of ``|G|²`` and
``tr(Σ)``::

    |G|²  ≈ (B_big·|g_big|² - B_small·|g_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|g_small|² - |g_big|²) / (1/B_small - 1/B_big)

Each is noisy on its own: both are smoothed with a bias-corrected exponential
moving average before their ratio is taken, as the paper and AdaptDL do.
"""

from __future__ import annotations

from typing import Any

SMOOTHING = 0.95  # weight of the past in the moving averages: about the last 20 steps count


class MovingAverage:
    """A bias-corrected exponential moving average (the first values are not pulled toward 0)."""

    def __init__(self, decay: float = SMOOTHING) -> None:
        self.decay = decay
        self._sum = 0.0
        self._weight = 0.0

    def add(self, value: float) -> None:
        self._sum = self.decay * self._sum + (1 - self.decay) * value
        self._weight = self.decay * self._weight + (1 - self.decay)

    @property
    def value(self) -> float | None:
        return self._sum / self._weight if self._weight else None


class NoiseScale:
    """Smoothed estimates of ``|G|²`` and ``tr(Σ)`` from (small, big) batch gradient norms."""

    def __init__(self) -> None:
        self.true_sq = MovingAverage()   # |G|²
        self.trace = MovingAverage()     # tr(Σ), per example
        self.steps = 0

    def add(self, small_sq: float, big_sq: float, b_small: int, b_big: int) -> None:
        if b_big <= b_small:
            return
        self.true_sq.add((b_big * big_sq - b_small * small_sq) / (b_big - b_small))
        self.trace.add((small_sq - big_sq) / (1 / b_small - 1 / b_big))
        self.steps += 1

    @property
    def value(self) -> float | None:
        """``B_noise`` in examples, or None until it can be told (and while ``|G|²`` reads as ≤ 0)."""
        return ratio(self.trace.value, self.true_sq.value)


def ratio(trace: float | None, true_sq: float | None) -> float | None:
    if trace is None or true_sq is None or true_sq <= 0:
        return None
    return max(trace, 0.0) / true_sq


class _HookState:
    """What the communication hook accumulates over the buckets of one backward pass."""

    def __init__(self, noise: NoiseScale, world_size: int, batch_size: Any) -> None:
        self.noise = noise
        self.world_size = world_size
        self.batch_size = batch_size   # () -> this rank's current batch size (0 when unknown)
        self.small: list[Any] = []     # squared norms of this rank's gradient, one per bucket
        self.big: list[Any] = []       # squared norms of the averaged gradient
        self.last_seen = False

    def finish_bucket(self) -> None:
        if not self.last_seen or len(self.big) < len(self.small):
            return
        small_sq = float(sum(self.small))
        big_sq = float(sum(self.big))
        self.small, self.big, self.last_seen = [], [], False
        b_small = self.batch_size()
        if b_small:
            self.noise.add(small_sq, big_sq, b_small, b_small * self.world_size)


def measure(model: Any, noise: NoiseScale, world_size: int, batch_size: Any) -> None:
    """Register on a DistributedDataParallel ``model`` the all-reduce hook that feeds ``noise``.

    The hook does what DDP's default one does (divide by the world size, all-reduce,
    return the average) and takes the two squared norms on the way.
    """
    import torch
    import torch.distributed as dist

    def averaging_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses annotations but its own
        grads = bucket.buffer()
        state.small.append(torch.linalg.vector_norm(grads, dtype=torch.float32) ** 2)
        state.last_seen = state.last_seen or bucket.is_last()
        grads.div_(state.world_size)
        future = dist.all_reduce(grads, async_op=True).get_future()

        def averaged(done: Any) -> Any:
            mean = done.value()[0]
            state.big.append(torch.linalg.vector_norm(mean, dtype=torch.float32) ** 2)
            state.finish_bucket()
            return mean

        return future.then(averaged)

    model.register_comm_hook(_HookState(noise, world_size, batch_size), averaging_hook)
