"""``run.exec(source)`` and ``%%ray_exec``: the chosen ranks run the notebook's code in their training code's
namespace at the next step boundary, the same step on each, and answer with the value of its last expression
and what it printed (:mod:`nbtrain._cluster.rank.exec_and_patch`).

The ranks wait at that boundary while it runs, so a collective in ``source`` meets the other ranks' (give every
rank then). One exec at a time: a second is refused while a rank of the first has not answered, since a rank
cannot be made to drop code it is running without stopping the rank.
"""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import AFTER_UPDATE, CommandKind, Issuing, RankSide
from nbtrain._cluster.command_kinds.stacks import asked_ranks
from nbtrain._cluster.commands import EXEC, Command
from nbtrain._exceptions import InvalidOptionError

NO_STEP_BOUNDARY = ("Rank {rank} has no step boundary to run code at: its code has stepped no optimizer nbtrain sees "
                    "and called no nbtrain.report() yet. exec() and patch() run between two steps; give nbtrain the "
                    "optimizer (nbtrain.prepare_optimizer or nbtrain.steerable) or report() from the loop.")


def checked_source(call: str, source: Any) -> str:
    """``source`` compiled here first: a syntax error is the notebook's to show, with its line."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidOptionError(f"run.{call}(source): the code to run is a non-empty string of Python.")
    try:
        compile(source, f"<run.{call}>", "exec")
    except SyntaxError as problem:
        line = f" (line {problem.lineno}: {(problem.text or '').strip()})" if problem.lineno else ""
        raise InvalidOptionError(f"run.{call}(source) is not valid Python: {problem.msg}{line}.") from None
    return source


class Exec(CommandKind):
    name: ClassVar[str] = EXEC
    marked: ClassVar[bool] = True
    hook: ClassVar[str] = AFTER_UPDATE
    asks_ranks: ClassVar[bool] = True

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        return {**args, "source": checked_source("exec", args.get("source"))}

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        running = asked_ranks("code run on", args.get("ranks"), sorted(issuing.running))
        for earlier in issuing.steering.commands:
            if earlier.kind != EXEC or earlier.args.get("attempt") != issuing.attempt:
                continue
            waiting = sorted(set(earlier.ranks) - issuing.steering.answered(earlier.id))
            if waiting:
                raise ValueError(f"exec {earlier.id} is still running on rank(s) {waiting}; a rank cannot drop code "
                                 "it runs without stopping. Wait for it (run.exec waits again with a longer "
                                 "timeout= only for a new exec), or run.stop() the run.")
        return {**args, "ranks": running, "attempt": issuing.attempt}

    def learnt(self, rank: RankSide, command: Command, pending: list[Command]) -> bool:
        if rank.has_step_boundary():
            return True
        rank.answer(command, False, NO_STEP_BOUNDARY.format(rank=rank.session.context.rank))
        return False

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.run_code(command)
        return None

    def describe(self, command: Command, where: str) -> str:
        lines = command.args.get("source", "").strip().splitlines()
        first = lines[0] if lines else ""
        shown = first if len(first) <= 40 and len(lines) == 1 else first[:39] + "…"
        return f"exec {shown!r} on rank(s) {command.ranks}" + where
