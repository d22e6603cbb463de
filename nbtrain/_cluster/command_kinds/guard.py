"""``run.guard(...)`` (and ``launch(guard=...)``): the guards every rank checks from the moment it learns them.

A guard watches; it changes nothing by itself, so it is in force at once, at no step, and is not one of the
run's changes. A new attempt keeps the last one; a rewind does not take it back."""

from __future__ import annotations

from typing import ClassVar

from nbtrain._cluster.command_kinds.kind import ON_LEARNING, CommandKind, RankSide, SupervisorSide
from nbtrain._cluster.commands import GUARD, Command
from nbtrain._guards import describe_guard


class Guard(CommandKind):
    name: ClassVar[str] = GUARD
    hook: ClassVar[str] = ON_LEARNING
    is_change: ClassVar[bool] = False
    replayed: ClassVar[str] = "last"
    bound_to_step: ClassVar[bool] = False
    survives_rewind: ClassVar[bool] = True

    def on_issued(self, steering: SupervisorSide, command: Command) -> None:
        steering.record("guard", self.describe(command, ""))

    def learnt(self, rank: RankSide, command: Command, pending: list[Command]) -> bool:
        rank.set_guard(command.args)
        return False

    def describe(self, command: Command, where: str) -> str:
        return describe_guard(command.args)
