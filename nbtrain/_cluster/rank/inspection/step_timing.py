"""Where a rank's step time goes: waiting for data, computing, and communicating gradients.

- **Data wait**: the time a prepared loader (:mod:`~nbtrain._cluster.rank.data.loading`) or a Ray Dataset shard's
  iterator (:mod:`.counted_shard`) takes to hand over the next batch (a prepared loader's move to
  the device included).
- **Gradient communication**: on a model from ``prepare_model`` (DDP), a communication hook
  times the all-reduce of each backward pass: from the moment the last gradient bucket is
  handed to the all-reduce (the backward pass's computing is done) to the moment the last
  all-reduce completes, the part of communication the step waits for. A rank that waits for a
  slower one waits here. The hook keeps DDP's default semantics (``allreduce_hook``: divide by
  the world size, all-reduce, average); a hook registered on the model afterwards (the user's,
  or ``gns``'s) runs inside it instead of replacing it. On a GPU the times are the host's view.
- **Compute**: the step time less both.

Steps are counted at the end of each backward pass's all-reduce on a DDP model, else at each
batch a prepared loader or shard hands out; a step is the time from one to the next. The
heartbeat carries the averages per step over the last second or more (:meth:`StepTimes.window`),
and the supervisor compares ranks (:mod:`nbtrain._cluster.supervisor.stragglers`). The run's
``step_timing=False`` leaves all of this out (``benchmarks/step_timing.py`` measures its cost).
"""

from __future__ import annotations

import threading
import time
from typing import Any

WINDOW_S = 1.0  # the heartbeat's averages cover at least this long


class StepTimes:
    """One rank's running totals; the loaders and the communication hook add to them."""

    def __init__(self) -> None:
        self.steps = 0
        self.step_s = 0.0
        self.data_s = 0.0
        self.comm_s = 0.0
        self.by_backward = False  # a DDP hook counts the steps (else the batches do)
        self.allreduce_in_flight = False  # the DDP hook's last bucket is handed over, its all-reduce not done
        self._last: float | None = None
        self._mark = (time.monotonic(), 0, 0.0, 0.0, 0.0)

    def batch(self, waited_s: float) -> None:
        """A batch was handed out after ``waited_s`` seconds of waiting for it."""
        if self.by_backward:
            self.data_s += waited_s
            return
        if self._last is not None:  # the first batch after a pause starts a step: its wait is no step's
            self.data_s += waited_s
        self.tick()

    def tick(self) -> None:
        """A step ended."""
        now = time.perf_counter()
        if self._last is not None:
            self.steps += 1
            self.step_s += now - self._last
        self._last = now

    def pause(self) -> None:
        """The loop left the loader (an epoch ended): the time until the next batch is not a step's."""
        if not self.by_backward:
            self._last = None

    def window(self) -> dict[str, float]:
        """Milliseconds per step of the steps since the last window (at least :data:`WINDOW_S` ago), split
        into data wait, compute and communication; empty until such a window has a step."""
        now = time.monotonic()
        began, steps, step_s, data_s, comm_s = self._mark
        count = self.steps - steps
        if now - began < WINDOW_S or count <= 0:
            return {}
        self._mark = (now, self.steps, self.step_s, self.data_s, self.comm_s)
        step, data, comm = ((self.step_s - step_s) / count, (self.data_s - data_s) / count,
                            (self.comm_s - comm_s) / count)
        data, comm = min(data, step), min(comm, max(step - data, 0.0))
        return {"step_ms": step * 1e3, "data_ms": data * 1e3, "comm_ms": comm * 1e3,
                "compute_ms": max(step - data - comm, 0.0) * 1e3}


def time_communication(model: Any, timing: StepTimes | None) -> None:
    """Time ``model``'s gradient all-reduce (a DistributedDataParallel model; anything else is left alone)."""
    from torch.nn.parallel import DistributedDataParallel

    if timing is None or not isinstance(model, DistributedDataParallel):
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group = model.process_group  # DDP's own (a ddp_kwargs process_group, else the world): the default hook's
    inner: dict[str, Any] = {"state": group, "hook": default_hooks.allreduce_hook}
    backward = _Backward(timing)

    def timed_allreduce(_state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses annotations but its own
        backward.launched(bucket.is_last())
        return inner["hook"](inner["state"], bucket).then(backward.completed)

    model.register_comm_hook(None, timed_allreduce)
    timing.by_backward = True

    def register_comm_hook(state: Any, hook: Any) -> None:
        """DDP takes one hook: a later one runs inside the timing hook instead."""
        inner.update(state=state, hook=hook)

    def register_builtin_comm_hook(kind: Any) -> None:
        import torch.distributed as dist

        hooks = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        inner.update(state=group, hook=hooks[kind])

    model.register_comm_hook = register_comm_hook
    model._register_builtin_comm_hook = register_builtin_comm_hook


class _Backward:
    """One backward pass's buckets: when the last was handed over, when the last all-reduce completed."""

    def __init__(self, timing: StepTimes) -> None:
        self._timing = timing
        self._lock = threading.Lock()  # the hook runs on autograd's thread, completions on the backend's
        self._pending = 0
        self._computed_at: float | None = None
        self._done_at = 0.0

    def launched(self, last: bool) -> None:
        with self._lock:
            self._pending += 1
            if last:
                self._computed_at = time.perf_counter()
                self._timing.allreduce_in_flight = True

    def completed(self, future: Any) -> Any:
        now = time.perf_counter()
        with self._lock:
            self._pending -= 1
            self._done_at = max(self._done_at, now)
            if self._pending == 0 and self._computed_at is not None:
                self._timing.comm_s += max(self._done_at - self._computed_at, 0.0)
                self._timing.allreduce_in_flight = False
                self._computed_at, self._done_at = None, 0.0
                self._timing.tick()
        return future.value()
