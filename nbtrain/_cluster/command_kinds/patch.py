"""``run.patch(source)`` and ``%%ray_patch``: the definitions in ``source`` rebound in the training code's globals
at one step on every rank (:mod:`nbtrain._cluster.rank.exec_and_patch`), so the next lookup of each name uses them.

A change of the run's code and part of its steered state: in the history ("patched scale at step 812"), kept by
a rewind (in place, the code stays patched), applied again by a new attempt (at the step it was first applied,
once its ranks get there), inherited by a fork. It waits on a rank for its first step boundary. Refused by the
ranks, nothing rebound, when the training code lacks a name and ``new`` was not given: it then never applies.
"""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.exec_code import checked_source
from nbtrain._cluster.command_kinds.kind import AFTER_UPDATE, CommandKind, RankSide
from nbtrain._cluster.commands import PATCH, Command
from nbtrain._exceptions import InvalidOptionError


def patched_names(source: str) -> list[str]:
    """What ``source`` defines at its top level (functions, classes, assigned names), refused when nothing."""
    import ast

    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.extend(name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.extend((alias.asname or alias.name).partition(".")[0] for alias in node.names)
    if not names:
        raise InvalidOptionError("run.patch(source) defines nothing: give it definitions (def, class, NAME = ...) "
                                 "to rebind in the training code; run.exec(source) runs other code.")
    return list(dict.fromkeys(names))


class Patch(CommandKind):
    name: ClassVar[str] = PATCH
    marked: ClassVar[bool] = True
    hook: ClassVar[str] = AFTER_UPDATE
    replayed: ClassVar[str] = "each"
    survives_rewind: ClassVar[bool] = True
    dropped_when_refused: ClassVar[bool] = True
    says_applied: ClassVar[bool] = False  # the rank says it once rebound (a refusal rebinds nothing)

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        source = checked_source("patch", args.get("source"))
        return {**args, "source": source, "names": patched_names(source), "new": bool(args.get("new"))}

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.patch_code(command, step)
        return None

    def describe(self, command: Command, where: str) -> str:
        return f"patched {', '.join(command.args.get('names', []))}" + where
