"""A script that starts its own training processes is stopped before it does, and told what to write.

On nbtrain each rank already is one of the run's processes, in the run's process group: a script that
``torch.multiprocessing.spawn``\\ s (or ``start_processes``) a worker per GPU, or runs torchrun in-process
(``torch.distributed.run.main``, ``torch.distributed.launcher.api.elastic_launch``), would start
``workers`` times too many, which would then wait for a rendezvous that never comes. While the session
runs, those calls raise an :class:`~nbtrain._exceptions.NbtrainError` naming the rank and the call, and
saying to call the worker function directly with this rank's local rank and set ``workers=``.
DataLoader workers are not concerned: they are started with Python's ``multiprocessing``, which stays
as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nbtrain._cluster.rank.their_code.on_import import after_import
from nbtrain._exceptions import NbtrainError

# module -> the names in it that start processes for training
STARTERS = {
    "torch.multiprocessing": ("spawn", "start_processes"),
    "torch.multiprocessing.spawn": ("spawn", "start_processes"),
    "torch.distributed.run": ("main", "run"),
    "torch.distributed.launcher.api": ("launch_agent",),
}


def install(session: Any) -> Callable[[], None]:
    """Until the returned undo runs, the starters raise instead of starting processes."""
    replaced: list[tuple[Any, str, Any]] = []  # (owner, name, original)

    def refuse(module: ModuleType) -> None:
        for name in STARTERS[module.__name__]:
            original = getattr(module, name, None)
            if callable(original):
                replaced.append((module, name, original))
                setattr(module, name, _refusal(session, f"{module.__name__}.{name}", original))
        launch = getattr(module, "elastic_launch", None)
        if module.__name__ == "torch.distributed.launcher.api" and isinstance(launch, type):
            original = launch.__dict__["__call__"]
            replaced.append((launch, "__call__", original))
            launch.__call__ = _refusal(session, "torch.distributed.launcher.api.elastic_launch", original)  # type: ignore[method-assign]

    stops = [after_import(name, refuse) for name in STARTERS]

    def undo() -> None:
        for stop in stops:
            stop()
        for owner, name, original in reversed(replaced):
            setattr(owner, name, original)
    return undo


def _refusal(session: Any, called: str, original: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def refused(*args: Any, **kwargs: Any) -> Any:
        ctx = session.context
        msg = (f"Rank {ctx.rank} called {called}(): on nbtrain each rank is already one of the run's processes "
               f"({ctx.world_size} of them, in a process group nbtrain joined), so it must not start its own. "
               "Call the worker function directly instead, with this rank's local rank: "
               "fn(nbtrain.get_context().local_rank, *args) (or int(os.environ['LOCAL_RANK'])), and choose how "
               "many processes with workers= (launch) or --workers (%%ray_train).")
        raise NbtrainError(msg)
    return refused
