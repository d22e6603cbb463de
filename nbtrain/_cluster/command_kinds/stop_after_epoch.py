"""``run.stop(after="epoch")``: every rank learns at one step which epoch is its last, so all end the same one.

The supervisor names the furthest epoch it knows of; a rank that is further by the command's step takes
its own (the history keeps it as ``before``)."""

from __future__ import annotations

from typing import Any, ClassVar

from nbtrain._cluster.command_kinds.kind import CommandKind, Issuing, RankSide
from nbtrain._cluster.commands import STOP_AFTER_EPOCH, Command


class StopAfterEpoch(CommandKind):
    name: ClassVar[str] = STOP_AFTER_EPOCH

    def issued_args(self, args: dict[str, Any], issuing: Issuing) -> dict[str, Any]:
        running = issuing.running
        stepping = any(said.step > 1 for said in running.values())  # a loader or integration says so by then
        if stepping and not any(said.epochs_counted for said in running.values()):
            raise ValueError("its ranks count no epochs: stop(after='epoch') needs a loader from "
                             "nbtrain.prepare_loader (or Lightning's / Hugging Face's trainer through "
                             "nbtrain); stop() it, or checkpoint_now() first.")
        return {**args, "epoch": max((said.epoch for said in running.values()), default=0)}

    def apply(self, rank: RankSide, command: Command, step: int) -> dict[str, Any] | None:
        rank.stop_after_epoch = max(command.epoch, rank.session.epoch)
        return {"epoch": rank.stop_after_epoch}

    def describe(self, command: Command, where: str) -> str:
        return f"stop after epoch {command.epoch}" + where.replace(" at ", ", learnt at ")
