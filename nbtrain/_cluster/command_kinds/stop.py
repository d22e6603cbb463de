"""``run.stop()``, where the ranks can take it: every rank ends its function at one step, so none is left
waiting in a collective for a peer that stopped, and each rank's process goes back to the session's warm pool
for the next run (a stop, an edit and a re-run is the notebook's loop: killing the ranks made that re-run start
new processes and import torch again). The supervisor issues it on the user's stop; where the ranks have not
all ended a little later (a loop with no step nbtrain sees, a step that takes long, a paused run), they are
killed as before (:mod:`nbtrain._cluster.supervisor.controller`)."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import AFTER_UPDATE, CommandKind, RankSide
from nbtrain._cluster.commands import STOP, Command, SteeringBeat

LONGEST_WAIT_S = 3.0  # a stop never waits longer for the ranks to reach its step: past that, they are killed
ENDING_S = 1.0        # a rank's last rows pushed and its function's end seen by the supervisor, once at the step


class Stop(CommandKind):
    name: ClassVar[str] = STOP
    hook: ClassVar[str] = AFTER_UPDATE  # the step's update made on every rank: the replicas stay identical
    is_change: ClassVar[bool] = False
    says_applied: ClassVar[bool] = False

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.end_function(step)  # raises: the function ends here
        return None

    def describe(self, command: Command, where: str) -> str:
        return "stop" + where


def wait_for_ranks_s(running: dict[int, SteeringBeat], at_step: int) -> float | None:
    """How long a stop waits for every rank to end at ``at_step`` (what each rank taking steps last said is in
    ``running``), or None where it should not wait at all (the ranks are killed at once, as before): no rank
    measured a rate yet, one is paused (held inside its step), or the step is further than
    :data:`LONGEST_WAIT_S` allows at the slowest rank's rate."""
    if not running or any(said.paused_at is not None or said.held_after_epoch is not None
                          for said in running.values()):
        return None
    rates = [said.rate for said in running.values()]
    if any(rate is None or rate <= 0 for rate in rates):
        return None
    behind = at_step - min(said.step for said in running.values())
    wait_s = behind / min(rate for rate in rates if rate is not None) + ENDING_S
    return wait_s if wait_s <= LONGEST_WAIT_S else None
