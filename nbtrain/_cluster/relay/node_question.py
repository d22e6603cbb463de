"""One node's standing question for the notebook's commands, asked once for all of its ranks.

Each rank learns the notebook's commands from a long poll (see :mod:`nbtrain._cluster.rank.rank_steering`).
Asked of the supervisor by every rank, a run of N ranks holds N of the supervisor's threads waiting,
wakes N of them for each command and answers N calls a second while nothing happens. Where a node
has a push relay (:mod:`~nbtrain._cluster.relay.push_relay`), its ranks ask the relay instead: the
relay holds one question on the supervisor for the node, keeps every command it has learnt, and
answers each of its ranks' questions from them the moment a command arrives. The supervisor then
holds one thread per node, and a command is handed on once per node.

The relay's answer is the supervisor's, as a rank would have had it: the commands after the rank's
``seen``, and whether the run wants a checkpoint now (an elastic run about to resize), which also ends
a rank's wait when it changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nbtrain._cluster.commands import Command

ASK_WAIT_S = 1.0  # the relay's question on the supervisor waits this long for a command (as a rank's would)
RETRY_S = 1.0     # after a failed question (the supervisor restarting), ask again this much later


class NodeQuestion:
    """Runs inside a node's relay (an async actor): its ranks' questions, answered from one of its own."""

    def __init__(self, supervisor: Any, attempt: int) -> None:
        self._supervisor = supervisor
        self._attempt = attempt
        self._commands: list[Command] = []   # every command of the run learnt so far, by id
        self._checkpoint = False
        self._version = 0                    # counts changes: a waiting rank is answered when it moves
        self._changed: asyncio.Condition | None = None
        self._asking: asyncio.Task[None] | None = None

    async def ask(self, seen: int, wait_s: float) -> tuple[bool, list[Command]]:
        """A rank's question: the commands after its ``seen``-th as soon as there are any (else after ``wait_s``),
        and whether a checkpoint is wanted. Only the relay's attempt's ranks ask it (a relay is an attempt's)."""
        if self._asking is None:  # the node's first question starts the node's one question on the supervisor
            self._changed = asyncio.Condition()
            self._asking = asyncio.get_running_loop().create_task(self._ask_supervisor())
        assert self._changed is not None
        version = self._version
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(
                    lambda: self._newest() > seen or self._version != version), wait_s)
            except asyncio.TimeoutError:
                pass
        return self._checkpoint, [command for command in self._commands if command.id > seen]

    def _newest(self) -> int:
        return self._commands[-1].id if self._commands else 0

    async def _ask_supervisor(self) -> None:
        """The node's standing question, for as long as the relay lives (its attempt's)."""
        while True:
            try:
                checkpoint, commands = await self._supervisor.control.remote(self._attempt, self._newest(),
                                                                             ASK_WAIT_S)
            except Exception:  # noqa: BLE001 - the supervisor restarting: the ranks wait on, and ask again
                await asyncio.sleep(RETRY_S)
                continue
            fresh = [command for command in commands if command.id > self._newest()]
            if fresh or bool(checkpoint) != self._checkpoint:
                self._commands.extend(fresh)
                self._checkpoint = bool(checkpoint)
                self._version += 1
                assert self._changed is not None
                async with self._changed:
                    self._changed.notify_all()
