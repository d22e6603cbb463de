"""``run.send(name, **payload)``: the ranks' ``@nbtrain.on_command(name)`` handler runs after the same step's
update, and each rank's answer goes back to the notebook. Not one of the run's changes: a new attempt does
not send it again."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import AFTER_UPDATE, CommandKind, RankSide
from nbtrain._cluster.commands import USER, Command
from nbtrain._exceptions import InvalidOptionError


class Send(CommandKind):
    name: ClassVar[str] = USER
    hook: ClassVar[str] = AFTER_UPDATE
    is_change: ClassVar[bool] = False
    says_applied: ClassVar[bool] = False  # its answer says it

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(args.get("name"), str) or not args["name"]:
            raise InvalidOptionError("run.send(command, ...): the command is a name, like 'eval'.")
        return args

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.run_handler(command)
        return None

    def describe(self, command: Command, where: str) -> str:
        return f"command {command.handler[0]!r}" + where
