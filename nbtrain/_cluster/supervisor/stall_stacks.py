"""The stacks of a run that stalls: taken as the stall is seen, told in an event after the stall's own.

When a rank makes no progress for ``stall_timeout_s``, the controller asks every running rank for its
stacks (a ``stacks`` command, answered by each rank's steering listener without pausing it) and the
answers become one ``stacks`` event, after the ``stall`` one (the dashboard's notice shows it):
*Stacks at the stall: rank 0 waits in a collective (all_reduce) called from train.py:41 in step
(dist.all_reduce(t)); rank 1 is elsewhere: train.py:37 in load (time.sleep(5))*. A run that goes on
(``on_stall="warn"``) waits for them on a thread of its own; one that the stall ends waits for them
first (at most :data:`WAIT_S`), before its ranks are stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from nbtrain._cluster.commands import STACKS, SteeringBeat, where_rank_is
from nbtrain._cluster.supervisor.run_steering import RunSteering

WAIT_S = 10.0


def ask(steering: RunSteering, running: dict[int, SteeringBeat], record: Callable[[str], None], wait: bool) -> None:
    """Ask the running ranks for their stacks; ``record`` the event once they answered (or :data:`WAIT_S`)."""
    try:
        command = steering.issue(STACKS, {"ranks": None}, running, live=True)
    except ValueError:
        return  # no rank runs now: nothing to ask
    ranks = command.ranks

    def tell() -> None:
        answers = steering.results(command.id, ranks, WAIT_S)
        record("Stacks at the stall: " + "; ".join(where_rank_is(rank, answers.get(rank), WAIT_S) for rank in ranks)
               + ". run.stacks() shows every thread of each rank, now.")

    if wait:
        tell()
    else:
        threading.Thread(target=tell, name="nbtrain-stall-stacks", daemon=True).start()
