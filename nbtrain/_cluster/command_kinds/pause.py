"""``run.pause()``: every rank held at the same step, before its update, until ``run.resume()``.

The rank stops counting itself resumed the moment it learns a pause (so a resume learnt before the pause's
step calls it off); at the step it says so, then holds (:meth:`RankSide.hold`)."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import CommandKind, Issuing, RankSide
from nbtrain._cluster.commands import PAUSE, Command


class Pause(CommandKind):
    name: ClassVar[str] = PAUSE
    marked: ClassVar[bool] = True
    holds_the_run: ClassVar[bool] = True

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        if issuing.steering.paused():
            raise ValueError("the run is paused already (or about to be); resume it first.")
        return args

    def learnt(self, rank: RankSide, command: Command, pending: list[Command]) -> bool:
        rank.resumed.clear()
        return True

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        return None

    def after_said(self, rank: RankSide, command: Command, step: int) -> None:
        rank.hold(step)

    def describe(self, command: Command, where: str) -> str:
        return "paused" + where
