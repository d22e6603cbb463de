"""``run.checkpoint_now()``: :func:`nbtrain.checkpoint_requested` turns true on every rank at the same step,
until its code saves."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import CommandKind, RankSide
from nbtrain._cluster.commands import CHECKPOINT, Command


class CheckpointNow(CommandKind):
    name: ClassVar[str] = CHECKPOINT
    marked: ClassVar[bool] = True

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.checkpoint_wanted = True
        return None

    def describe(self, command: Command, where: str) -> str:
        return "checkpoint asked" + where
