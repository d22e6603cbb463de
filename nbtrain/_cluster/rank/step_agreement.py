"""A rank's part in settling the step every rank applies a command at.

The supervisor proposes a command's step a little ahead of the furthest rank. A rank tells it from which step
on it can apply what it has just learnt (:meth:`StepAgreement.learnt`), and asks, as it reaches the step with
the command due, whether this is the step (:meth:`StepAgreement.step_for`): the first rank to ask settles it
for all, so a rank that learnt a command late moves it on for every rank rather than apply it alone
(:meth:`~nbtrain._cluster.supervisor.run_steering.RunSteering.step_for` decides).
"""

from __future__ import annotations

from typing import Any

from nbtrain._cluster.commands import AGREE_WAIT_S, Command

CALL_TIMEOUT_S = 10.0  # beyond the supervisor's own wait for the other ranks' word


class StepAgreement:
    """A rank's part in settling the step every rank applies a command at, with its supervisor
    (:meth:`~nbtrain._cluster.supervisor.run_steering.RunSteering.step_for`)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def learnt(self, command_ids: list[int], first_step: int) -> None:
        """Tell the supervisor (not waited for) that this rank can apply these commands from ``first_step`` on."""
        ctx = self.session.context
        self.session.supervisor.command_learnt.remote(ctx.attempt, ctx.rank, command_ids, first_step)

    def step_for(self, command: Command, step: int) -> int:
        """The step every rank applies ``command`` at, asked at ``step`` with it due; ``step`` itself if the
        supervisor cannot be asked (the attempt is ending: nothing else of it is steered)."""
        import ray

        ctx = self.session.context
        try:
            return int(ray.get(self.session.supervisor.step_for.remote(ctx.attempt, command.id, ctx.rank, step),
                               timeout=AGREE_WAIT_S + CALL_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - the supervisor gone or restarting
            return step
