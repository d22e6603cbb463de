"""The code's own ``init_process_group`` gets the run's process group.

nbtrain joins the rank to the run's ``torch.distributed`` group before the code runs (see the worker), so
a torchrun script's ``init_process_group("gloo")``, or a library's (Accelerate, Lightning and Hugging Face
first ask ``is_initialized()``; not every library does), would fail with torch's "trying to initialize
the default process group twice". While the session runs, a call with the group in place returns it
instead, and says so in the rank's log (once for each backend asked); asking for a backend that differs
from the run's (``"nccl"`` on a CPU rank) gets the run's group too, which is the one that fits the rank's
device, and the log line names both. A ``destroy_process_group()`` of the default group is left to
nbtrain, which tears the group down after the function returned, so a library that asks
``is_initialized()`` after the code's destroy still sees the group it expects.

The variables torchrun sets are the worker's (``_torchrun_environment``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from nbtrain._exceptions import NbtrainError


def install(session: Any, running: Callable[[], bool]) -> Callable[[], None]:
    """Put the patches in place for ``session``; returns what undoes them. ``running()``: whether
    the code still runs (after it, the worker destroys the group itself, through the same function)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original_init, original_destroy = c10d.init_process_group, c10d.destroy_process_group
    told: set[str] = set()  # the backends asked for, each said once

    @functools.wraps(original_init)
    def init_process_group(backend: Any = None, init_method: str | None = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, *args: Any, **kwargs: Any) -> None:
        if not c10d.is_initialized():  # nbtrain's own join, or a group the code destroyed: torch's own
            original_init(backend, init_method, timeout, world_size, rank, *args, **kwargs)
            return
        ctx = session.context
        if world_size not in (-1, ctx.world_size) or rank not in (-1, ctx.rank):
            msg = (f"Rank {ctx.rank}: init_process_group(world_size={world_size}, rank={rank}) does not match the "
                   f"run's group, which nbtrain joined before your code ran ({ctx.world_size} ranks, this one "
                   f"rank {ctx.rank}). Leave world_size and rank out (torchrun's env:// reads them from WORLD_SIZE "
                   f"and RANK, which nbtrain sets), or launch with workers={world_size}.")
            raise NbtrainError(msg)
        if str(backend) not in told:
            told.add(str(backend))
            have = c10d.get_backend()
            asked = "" if backend in (None, have) else (
                f" (it asked for {backend!r}; the run's {have!r} group fits this rank's {ctx.device} device)")
            print(f"nbtrain: rank {ctx.rank}'s init_process_group() reused the run's process group ({have}, "
                  f"{ctx.world_size} ranks), which nbtrain joined before the code ran{asked}.", file=sys.stderr)

    @functools.wraps(original_destroy)
    def destroy_process_group(group: Any = None) -> None:
        if (group is None or group is c10d.GroupMember.WORLD) and running():
            return  # nbtrain destroys the run's group after the function returned
        original_destroy(group)

    for module in (c10d, dist):
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group

    def undo() -> None:
        for module in (c10d, dist):
            module.init_process_group = original_init
            module.destroy_process_group = original_destroy
        _forget_accelerate()
    return undo


def _forget_accelerate() -> None:
    """Accelerate keeps the process group's ranks and devices in class-level state for the process's life: a
    warm worker's next run would start with this run's. Reset, as Accelerate's own tests do."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    try:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    except Exception as exc:  # noqa: BLE001 - another Accelerate version: the next run may see stale state
        print(f"nbtrain: could not reset Accelerate's state after the run: {exc}", file=sys.stderr)
