"""Named fakes for a rank's steering without a supervisor process (see nbtrain._cluster.rank.rank_steering)."""

from __future__ import annotations

from nbtrain._cluster.commands import Command


class AgreedAsAsked:
    """The supervisor's step agreement in a world of one rank: every command is settled at the step the rank asks
    at (the rank asks only with it due), as :meth:`RunSteering.step_for` settles it when no other rank is waited
    for. Keeps what the rank said and asked."""

    def __init__(self) -> None:
        self.said: list[tuple[list[int], int]] = []
        self.asked: list[tuple[int, int]] = []

    def learnt(self, command_ids: list[int], first_step: int) -> None:
        self.said.append((command_ids, first_step))

    def step_for(self, command: Command, step: int) -> int:
        self.asked.append((command.id, step))
        return step
