"""``run.resume()``: a paused run goes on, or a pause not reached yet is called off — at once, at no step."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import ON_LEARNING, CommandKind, Issuing, RankSide
from nbtrain._cluster.commands import PAUSE, RESUME, Command


class Resume(CommandKind):
    name: ClassVar[str] = RESUME
    hook: ClassVar[str] = ON_LEARNING
    bound_to_step: ClassVar[bool] = False

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        if not issuing.steering.paused():
            raise ValueError("the run is not paused; nothing to resume.")
        return args

    def learnt(self, rank: RankSide, command: Command, pending: list[Command]) -> bool:
        pending[:] = [c for c in pending if c.kind != PAUSE]  # a pause not reached yet is off
        rank.resumed.set()
        rank.rearm_guard()
        return False

    def describe(self, command: Command, where: str) -> str:
        return "resumed"
