"""``run.adjust(lr=...)``: optimizer settings changed on every rank before the same step's update.

Re-applied by each new attempt (unless a rewind went back from it), from the steps it was applied at."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import CommandKind, Issuing, RankSide, short
from nbtrain._cluster.commands import ADJUST, NO_SETTING_GIVEN, Command, checked_settings
from nbtrain._exceptions import InvalidOptionError


class Adjust(CommandKind):
    name: ClassVar[str] = ADJUST
    marked: ClassVar[bool] = True
    needs_optimizer: ClassVar[bool] = True
    replayed: ClassVar[str] = "each"
    held_by_optimizer_state: ClassVar[bool] = True

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        group = args.get("group")
        settings = checked_settings({key: value for key, value in args.items() if key != "group"},
                                    "adjust({name}=...)")
        if not settings:
            raise InvalidOptionError(NO_SETTING_GIVEN)
        if group is not None and (not isinstance(group, int) or isinstance(group, bool) or group < 0):
            raise InvalidOptionError(f"adjust(group=...) is a param group's index (0, 1, ...), not {group!r}.")
        return {**settings, "group": group}

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        """Refused when the ranks' optimizers lack a setting or the param group; unchecked before any rank runs
        (its optimizers check it when it applies)."""
        settings = {key: value for key, value in args.items() if key != "group"}
        if not settings:
            raise ValueError(NO_SETTING_GIVEN)
        running = issuing.running
        known = next((said.settings for said in running.values() if said.settings), None)
        if known is None:
            if issuing.live and running:
                raise ValueError("its code gives nbtrain no optimizer to adjust. Call "
                                 "nbtrain.prepare_optimizer(optimizer) or nbtrain.steerable(optimizer) in the "
                                 "training function (Lightning: nbtrain.lightning.trainer(); Hugging Face: "
                                 "nbtrain.huggingface's callback).")
            return args
        missing = [key for key in settings if key not in known]
        if missing:
            raise ValueError(f"its optimizer has no {', '.join(missing)}; it has {', '.join(sorted(known))}.")
        group = args.get("group")
        if group is not None and not (isinstance(group, int) and 0 <= group < len(known.get("lr", [None]))):
            raise ValueError(f"group={group!r}: its optimizers have {len(known.get('lr', []))} param groups "
                             "(0-based).")
        return args

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        before = rank.values()
        rank.adjust(command.settings, command.group)
        return before

    def describe(self, command: Command, where: str) -> str:
        before = command.before or {}
        parts = []
        for key, value in command.settings.items():
            old = before.get(key)
            shown_old = short(old[0] if isinstance(old, list) and len(set(map(repr, old))) == 1 else old)
            parts.append(f"{key} {shown_old} → {short(value)}" if old is not None else f"{key} → {short(value)}")
        group = f" (param group {command.group})" if command.group is not None else ""
        return ", ".join(parts) + group + where
