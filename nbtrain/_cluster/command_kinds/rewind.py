"""``run.rewind(step)`` (and a guard's rewind): every rank goes back, in place, to the restore point it took at
the same checkpoint, at the same step, and the run's rows past that step become a branch it left.

The supervisor picks the point (the latest every running rank has, at or before the step asked) and refuses
a second rewind while one is under way. With a prepared loader a rank applies it as the next batch is taken
(the loader then starts again at the point's place); otherwise before the update."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import CommandKind, Issuing, RankSide
from nbtrain._cluster.commands import REWIND, Command


class Rewind(CommandKind):
    name: ClassVar[str] = REWIND
    marked: ClassVar[bool] = True
    needs_optimizer: ClassVar[bool] = True
    between_batches: ClassVar[bool] = True
    event: ClassVar[str] = "rewind"
    goes_back: ClassVar[bool] = True

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        """The args with the step it goes back to and the batches it skips after it."""
        running = issuing.running
        if not running:
            raise ValueError("no rank is running now to rewind (it may be starting or restarting); ask again once "
                             "its ranks run.")
        under_way = [c for c in issuing.steering.commands
                     if c.kind == REWIND and c.applied_step is None and c.dropped is None]
        if under_way:
            raise ValueError(f"a rewind to step {under_way[-1].rewind[0]} is under way; ask again once it is done.")
        refusal = next((said.rewind_refusal for said in running.values() if said.rewind_refusal), None)
        if refusal:
            raise ValueError(refusal)
        common = set.intersection(*(set(said.restore_points) for said in running.values()))
        asked = args.get("step")
        at_or_before = sorted(step for step in common if asked is None or step <= asked)
        if not at_or_before:
            if not common:
                raise ValueError("its ranks have no restore point yet in the epoch they are in: each rank takes "
                                 "one at each nbtrain.save_checkpoint (call it on every rank), or ask "
                                 "run.checkpoint_now().")
            raise ValueError(f"it has no checkpoint at or before step {asked} to rewind to; its ranks can go back to "
                             f"step {', '.join(map(str, sorted(common)))} (the last checkpoints of the epoch they are "
                             "in).")
        to_step = at_or_before[-1]
        skip = args.get("skip")
        if skip is None:  # a guard's: through the batch that tripped
            skip = max(int(args.get("through", to_step)) - to_step, 0)
        return {"attempt": issuing.attempt,
                **{key: value for key, value in args.items() if key not in ("step", "through")},
                "to_step": to_step, "skip": int(skip)}

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.rewind(command)
        return None

    def describe(self, command: Command, where: str) -> str:
        to_step, skip = command.rewind
        by = f" ({command.args['why']})" if command.args.get("why") else ""
        lr = f", lr x{command.args['lr_factor']:g}" if command.args.get("lr_factor") else ""
        skipped = f", {skip} batch{'es' if skip != 1 else ''} skipped" if skip else ""
        return f"rewound to step {to_step}{skipped}{lr}{where.replace(' at ', ' from ')}{by}"
