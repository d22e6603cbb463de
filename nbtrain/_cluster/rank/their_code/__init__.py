"""What the user's own code meets on a rank, so that code written for torchrun runs unchanged.

Everything here runs in each rank's process, put in place as the rank's session starts and undone as
it ends (a warm worker runs other runs later), by :func:`install`:

- :mod:`.process_group`: the code's own ``init_process_group`` gets the group nbtrain joined, and its
  ``destroy_process_group`` is left to nbtrain (torchrun's variables are the worker's);
- :mod:`.summary_writer`: ``SummaryWriter`` scalars also become the rank's metric rows;
- :mod:`.own_processes`: ``torch.multiprocessing.spawn`` and in-process torchrun raise, saying what to write;
- :mod:`.epochs`: a ``DistributedSampler``'s ``set_epoch`` counts the rank's epochs, for
  ``run.stop(after="epoch")``;
- :mod:`.optimizers`: which optimizer is steered when the code steps a wrapper of one.

The optimizers the code steps are steered by torch's global step hooks (see
:mod:`~nbtrain._cluster.rank.rank_steering`), which the session registers itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtrain._cluster.rank.their_code import epochs, own_processes, process_group, summary_writer


def install(session: Any, running: Callable[[], bool]) -> Callable[[], None]:
    """Put every patch in place for ``session`` (a rank's ``TrainingSession``; ``running()``: whether the code
    still runs); returns what undoes them all, in reverse order. Nothing here imports the session's module."""
    undos = [process_group.install(session, running),
             *(part.install(session) for part in (summary_writer, own_processes, epochs))]

    def undo() -> None:
        for each in reversed(undos):
            each()
    return undo
