"""A kind of command of the tests' own (``tag``), registered the way any kind is: it travels with its commands to
the supervisor and the ranks, which know nothing of it beforehand."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain import InvalidOptionError
from nbtrain._cluster.command_kinds.kind import CommandKind, Issuing, RankSide
from nbtrain._cluster.commands import Command


class Tag(CommandKind):
    """Every rank prints the tag before the update of the step it lands on; the history keeps rank 0's lr then."""

    name: ClassVar[str] = "tag"

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(args.get("text"), str):
            raise InvalidOptionError(f"tag(text=...) is a string, not {args.get('text')!r}.")
        return args

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        if not issuing.running:
            raise ValueError("no rank runs to tag")
        return {**args, "ranks": sorted(issuing.running)}

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        print(f"tagged {command.args['text']!r} at step {step}", flush=True)
        return {"lr": rank.values().get("lr")}

    def describe(self, command: Command, where: str) -> str:
        return f"tag {command.args['text']!r}{where}"
