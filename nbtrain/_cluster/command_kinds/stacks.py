"""``run.stacks()`` (and a stall's own look): each asked rank answers with its threads' stacks the moment it
learns the command, on its listener's thread, so a rank stuck inside its step still answers."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import ON_LEARNING, CommandKind, Issuing, RankSide
from nbtrain._cluster.commands import STACKS, Command


def asked_ranks(what: str, asked: list[int] | None, running: list[int]) -> list[int]:
    """The ranks a command that asks ranks is for (None: every rank running), each one running."""
    if not running:
        raise ValueError(f"no rank is running now, to take {what} of (it may be starting or restarting; ask "
                         "again once its ranks run).")
    if asked is None:
        return running
    missing = [rank for rank in asked if rank not in running]
    if missing:
        raise ValueError(f"rank(s) {missing} are not running; its running ranks are {running}.")
    return sorted(set(asked))


class Stacks(CommandKind):
    name: ClassVar[str] = STACKS
    hook: ClassVar[str] = ON_LEARNING
    asks_ranks: ClassVar[bool] = True
    is_change: ClassVar[bool] = False
    bound_to_step: ClassVar[bool] = False

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        return {**args, "ranks": asked_ranks("stacks", args.get("ranks"), sorted(issuing.running))}

    def learnt(self, rank: RankSide, command: Command, pending: list[Command]) -> bool:
        rank.ask_stacks(command)
        return False

    def describe(self, command: Command, where: str) -> str:
        return "stacks asked"
