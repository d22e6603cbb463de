"""``run.profile(steps)``: torch.profiler on the asked ranks from one update for ``steps`` steps; it stays pending,
one step ahead, until its last (:meth:`RankSide.profile`), and each rank answers with its table and trace."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import AFTER_UPDATE, CommandKind, Issuing, RankSide
from nbtrain._cluster.command_kinds.stacks import asked_ranks
from nbtrain._cluster.commands import MAX_PROFILE_STEPS, PROFILE, Command
from nbtrain._exceptions import InvalidOptionError


class Profile(CommandKind):
    name: ClassVar[str] = PROFILE
    hook: ClassVar[str] = AFTER_UPDATE
    asks_ranks: ClassVar[bool] = True
    is_change: ClassVar[bool] = False
    says_applied: ClassVar[bool] = False  # its answer says it

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        steps = args.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_PROFILE_STEPS:
            raise InvalidOptionError(f"run.profile(steps=...) must be a whole number from 1 to {MAX_PROFILE_STEPS}, "
                                     f"got {steps!r}.")
        return args

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        return {**args, "ranks": asked_ranks("a profile", args.get("ranks"), sorted(issuing.running))}

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.profile(command, step)
        return None

    def describe(self, command: Command, where: str) -> str:
        return f"profile of {command.steps} steps on rank(s) {command.ranks}" + where
