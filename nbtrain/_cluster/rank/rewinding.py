"""A rank's part in ``run.rewind()``: restore points taken at each checkpoint, restored in place.

Every rank calls ``save_checkpoint`` (only rank 0 stores the file), so every rank can keep, at the same
steps, what it needs to go back there without a relaunch: a copy of the state of what nbtrain knows
of its loop — the models from ``prepare_model`` (parameters and buffers), the optimizers it steers
(their state and param groups, learning rates included), their LR schedulers, the RNGs (Python,
NumPy, torch CPU and CUDA), the ``report()`` step counts, and each ``prepare_loader`` loader's epoch
and place in it. A rank keeps the last :data:`KEEP_POINTS`, as the run keeps its last checkpoints; copies
are on the CPU (a model and its Adam state of S bytes cost about 3 S of host memory per point).

A rewind is a command like any other (see :mod:`nbtrain._cluster.commands`): every rank restores at
the same step, in the same processes and process group. With a prepared loader it is applied as the
loader is about to take the step's batch — the previous step complete (update, scheduler, report) —
and the loader starts again at its place in the epoch, ``skip`` batches further on. A loop without
one is rewound in the optimizer's step pre-hook (that step's update is skipped: its gradients are
dropped) and needs an ``@nbtrain.on_rewind`` function, which gets the run's checkpoint at that step
and puts its own loader (or anything else nbtrain does not know) back. Without either, the rank
says why it cannot rewind (:meth:`RestorePoints.refusal`), and the notebook's call is refused with it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import sys
from collections.abc import Callable
from typing import Any

from nbtrain._cluster.rank import optimizer_settings
from nbtrain._cluster.storage.run_storage import KEEP_CHECKPOINTS

KEEP_POINTS = KEEP_CHECKPOINTS
# A point copies at most this much model and optimizer state (MB); past it, only what an @on_rewind function
# cannot restore from the checkpoint is kept (counts, RNGs, the loader's place), so a large model costs no host memory.
BUDGET_MB = float(os.environ.get("NBTRAIN_REWIND_BUDGET_MB", "4096"))

_hooks: list[Callable[..., Any]] = []  # @on_rewind registrations in this process (this run's: cleared at its end)


def on_rewind(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn(checkpoint, step, skip_batches)``, called on every rank when the run is rewound in place
    (``run.rewind()`` or a guard): ``checkpoint`` is what ``save_checkpoint`` stored at ``step``. It restores
    what nbtrain cannot by itself — a loader of the code's own (move it ``skip_batches`` past the checkpoint's
    place), state outside the prepared model and optimizer — after nbtrain restored what it knows.

    Example::

        @nbtrain.on_rewind
        def back_to(checkpoint, step, skip_batches):
            my_loader.seek(checkpoint["position"] + skip_batches)
    """
    if not callable(fn):
        raise TypeError("on_rewind(fn): decorate a function, e.g. @nbtrain.on_rewind def back_to(checkpoint, step, "
                        "skip_batches): ...")
    _hooks.append(fn)
    return fn


def forget_hooks() -> None:
    """The run's function is over on this rank: a warm worker's next run starts with none."""
    _hooks.clear()


@dataclasses.dataclass
class RestorePoint:
    """What one rank copied of its training state at one checkpoint."""

    step: int
    epoch: int
    counts: tuple[int, int, int]                       # the reporter's step, calls, last step
    models: list[tuple[Any, dict[str, Any]]]           # (module, its state dict copied)
    params: list[tuple[Any, Any]]                      # (parameter, a copy): optimizers' params of no model
    optimizers: list[tuple[Any, dict[str, Any]]]
    schedulers: list[tuple[Any, dict[str, Any]]]
    rng: dict[str, Any]
    loaders: list[tuple[Any, int, int]]                # (prepared loader, its epoch, batches taken in it)
    grad_clip: float | None


class RestorePoints:
    """A rank's restore points and the refusal it gives when it cannot rewind itself; held by its steering."""

    def __init__(self, session: Any, steering: Any) -> None:
        self.session = session
        self.steering = steering        # the rank's RankSteering, which holds this
        self.models: list[Any] = []     # from prepare_model
        self.loaders: list[Any] = []    # from prepare_loader
        self.points: list[RestorePoint] = []
        self.too_big_mb: float | None = None  # the state's size when it was past BUDGET_MB at the last point

    def capture(self) -> None:
        """``save_checkpoint`` on this rank: a point at the current step (the oldest beyond KEEP_POINTS goes)."""
        session, steering = self.session, self.steering
        if self.refusal() is not None and not _hooks:
            return
        in_models = {id(p) for model in self.models for p in model.parameters()}
        params = [p for optimizer in steering.optimizers for group in optimizer.param_groups
                  for p in group["params"] if id(p) not in in_models]
        reporter = session.reporter
        size_mb = sum(t.numel() * t.element_size() for t in _tensors(
            ([model.state_dict() for model in self.models], params, [o.state for o in steering.optimizers]))) / 2**20
        whole = size_mb <= BUDGET_MB
        self.too_big_mb = None if whole else size_mb
        point = RestorePoint(
            step=session.current_step(), epoch=session.epoch,
            counts=(reporter.step, reporter.calls, reporter.last_step),
            models=[(model, _copied(model.state_dict())) for model in self.models] if whole else [],
            params=[(p, p.detach().to("cpu", copy=True)) for p in params] if whole else [],
            optimizers=[(optimizer, _copied(optimizer.state_dict())) for optimizer in steering.optimizers]
            if whole else [],
            schedulers=[(scheduler, _copied(scheduler.state_dict()))
                        for scheduler in optimizer_settings.schedulers(steering.optimizers)],
            rng=_rng_state(), loaders=[(loader, loader.epoch, loader.position) for loader in self.loaders],
            grad_clip=steering.grad_clip)
        self.points = [*[kept for kept in self.points if kept.step < point.step][-(KEEP_POINTS - 1):], point]

    def steps(self) -> tuple[int, ...]:
        """The steps this rank can rewind to now: its points in the epoch its loaders are in (a loop's own
        ``for epoch`` cannot be moved back)."""
        epoch = self.session.epoch
        return tuple(point.step for point in self.points
                     if not self.loaders or all(e == epoch for _loader, e, _taken in point.loaders))

    def refusal(self) -> str | None:
        """Why this rank cannot rewind itself (None: it can); an ``@on_rewind`` function makes up for it, given a
        place to rewind at: a prepared loader's next batch or an optimizer's next step."""
        rank = self.session.context.rank
        if _hooks:
            if self.steering.optimizers or self.session.uses_loader:
                return None
            return (f"rank {rank}'s loop gives nbtrain neither its optimizer (nbtrain.prepare_optimizer or "
                    "nbtrain.steerable) nor its loader (nbtrain.prepare_loader), so a rewind has no step to happen "
                    "at: give it one of them.")
        if self.too_big_mb is not None:
            return (f"rank {rank}'s model and optimizer state ({self.too_big_mb:.0f} MB) is more than a restore point "
                    f"copies (NBTRAIN_REWIND_BUDGET_MB, {BUDGET_MB:.0f} MB): register @nbtrain.on_rewind def "
                    "back_to(checkpoint, step, skip_batches): ... to load them from the checkpoint, or raise the "
                    "budget in the run's env.")
        optimizers = len(self.steering.optimizers)
        if optimizers and self.session.uses_loader:
            return None
        has = (f"{optimizers} optimizer{'s' if optimizers > 1 else ''} given to nbtrain" if optimizers
               else "no optimizer given to nbtrain")
        has += " and a loader prepared by nbtrain" if self.session.uses_loader else " and no loader prepared by nbtrain"
        lost = []
        if not optimizers:
            lost.append("the model's and optimizer's state (give the optimizer: nbtrain.prepare_optimizer(optimizer) "
                        "or nbtrain.steerable)")
        if not self.session.uses_loader:
            lost.append("the loop's position in its data (give the loader: "
                        "for batch in nbtrain.prepare_loader(loader))")
        return (f"rank {rank} has {has}, so nbtrain cannot restore {' nor '.join(lost)}. Either way works: use "
                "those, or register @nbtrain.on_rewind def back_to(checkpoint, step, skip_batches): ... in the "
                "training function to restore it yourself.")

    def restore(self, to_step: int, skip: int) -> None:
        """Put this rank back to its point at ``to_step``, ``skip`` batches further on; newer points are dropped.
        The supervisor picked a step every rank has a point at (see the heartbeat's ``restore_points``)."""
        point = next(kept for kept in self.points if kept.step == to_step)
        self._restore_point(point, skip)
        self.points = [kept for kept in self.points if kept.step <= to_step]
        if _hooks:
            checkpoint = self._checkpoint_at(to_step)
            for hook in list(_hooks):
                hook(checkpoint=checkpoint, step=to_step, skip_batches=skip)

    def _restore_point(self, point: RestorePoint, skip: int) -> None:
        import torch

        steering = self.steering
        with torch.no_grad():
            for model, state in point.models:
                model.load_state_dict(state)
            for param, kept in point.params:
                param.copy_(kept)
        for optimizer, state in point.optimizers:  # copied again: torch keeps the given tensors as its state, and
            optimizer.load_state_dict(_copied(state))  # the point must stay as it was for another rewind to it
            for group in optimizer.param_groups:
                for param in group["params"]:
                    param.grad = None
        for scheduler, state in point.schedulers:
            scheduler.load_state_dict(copy.deepcopy(state))
        _set_rng_state(point.rng)
        steering.grad_clip = point.grad_clip
        reporter = self.session.reporter
        reporter.step, reporter.calls, reporter.last_step = point.counts
        for loader, epoch, taken in point.loaders:
            loader.go_back(epoch, taken, skip)
        if point.loaders:
            reporter.step = point.counts[0] + skip  # the skipped batches keep their step numbers
        self.session.epoch = point.epoch

    def _checkpoint_at(self, step: int) -> Any:
        """What ``save_checkpoint`` stored at ``step``, for the ``@on_rewind`` functions (None if it is gone)."""
        import ray

        from nbtrain._cluster.storage.run_storage import checkpoint_source, load_trusted

        session = self.session
        found = ray.get(session.supervisor.checkpoint_at.remote(step))
        if found is None:
            return None
        meta, data, path = found
        return load_trusted(checkpoint_source(data, path, meta.get("format", "torch")), session.context.device,
                            session.payload.checkpoints.weights_only)


def _copied(state: Any) -> Any:
    """A state dict with every tensor copied to the CPU (containers copied, other values shared: immutable)."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return type(state)((key, _copied(value)) for key, value in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_copied(value) for value in state)
    return state


def _tensors(state: Any) -> Any:
    """Every tensor in nested containers (a state dict, an optimizer's state)."""
    import torch

    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)


def _rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])
