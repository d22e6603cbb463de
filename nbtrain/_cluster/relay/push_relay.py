"""One node's pushes gathered into one supervisor call per flush tick.

Every rank flushes on the same wall-clock ticks (:func:`~nbtrain._cluster.rank.session.until_next_tick`).
Straight to the supervisor, 256 ranks at the default 0.25 s are 1 024 actor calls a second into
one process, and each call costs the supervisor more than the rows it carries. With a relay on
each node (one small async actor, no CPU reserved, started beside the node's ranks), the
supervisor gets one call per node per tick carrying that node's ranks' pushes.

Ranks reach their relay over a Unix socket (see :mod:`~nbtrain._cluster.relay.relay_link`), not
by Ray calls, which would cost the ranks and the relay about a millisecond of CPU per push;
a relay that offers no socket (not Linux) is called with :meth:`PushRelay.push`.

A rank's push is answered only once the supervisor has taken it: the relay awaits its forward
before it answers. So "landed" means at the supervisor, as without a relay, and the rank's own
bookkeeping (one push in flight, a failed push sent again with the same ``seq``, the
supervisor dropping a push it has seen) is unchanged. A rank whose relay fails pushes straight to
the supervisor for the rest of its attempt.

The relay also holds the node's one standing question for the notebook's commands, answered for its
ranks (see :mod:`~nbtrain._cluster.relay.node_question`).

Which runs use relays is the ``feed_relay`` option: ``auto`` gives one to each node that holds
:data:`AUTO_MIN_NODE_RANKS` ranks or more, in runs of :data:`AUTO_MIN_WORLD` ranks or more.
"""

from __future__ import annotations

import asyncio
import hmac
import pickle
import secrets
import sys
from typing import Any

from nbtrain._cluster.commands import Command, Heartbeat
from nbtrain._cluster.relay.node_question import NodeQuestion
from nbtrain._cluster.relay.relay_link import FAILED, FRAME, LANDED, OPEN_TIMEOUT_S, TICK_GATHER_S

AUTO_MIN_WORLD = 16
AUTO_MIN_NODE_RANKS = 2

Push = tuple[int, int, int, list[dict[str, Any]], Heartbeat, list[tuple[str, float, str]]]


def wants_relays(feed_relay: str, world_size: int, ranks_on_node: int) -> bool:
    """Whether a node holding ``ranks_on_node`` of a run's ``world_size`` ranks gets a relay."""
    if feed_relay == "auto":
        return world_size >= AUTO_MIN_WORLD and ranks_on_node >= AUTO_MIN_NODE_RANKS
    return feed_relay == "always"


class _Tick:
    """The pushes of one tick on their way to the supervisor together."""

    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.all_in = asyncio.Event()
        self.landed: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class PushRelay:
    """Runs as an async Ray actor on one node; its ranks push over its socket (or call :meth:`push`)
    instead of calling the supervisor."""

    def __init__(self, supervisor: Any, node_ranks: int, attempt: int) -> None:
        self._supervisor = supervisor
        self._node_ranks = node_ranks
        self._question = NodeQuestion(supervisor, attempt)
        self._open: _Tick | None = None
        self._secret = secrets.token_bytes(32)  # what a connection to the socket must send first
        self._listening: asyncio.Task[tuple[str, bytes]] | None = None
        self._server: asyncio.AbstractServer | None = None

    async def socket_address(self) -> tuple[str, bytes] | None:
        """Where this node's ranks push without a Ray call, and the secret a connection sends first;
        None where abstract Unix sockets do not exist (not Linux)."""
        if sys.platform != "linux":
            return None
        if self._listening is None:  # the node's ranks ask at once: one socket, opened by the first
            self._listening = asyncio.get_running_loop().create_task(self._listen())
        return await asyncio.shield(self._listening)

    async def control(self, attempt: int, seen: int, wait_s: float) -> tuple[bool, list[Command]]:
        """A rank's standing question for commands, as the supervisor's ``control`` answers it (``attempt``: the
        relay's own, as the supervisor's signature has it)."""
        return await self._question.ask(seen, wait_s)

    async def _listen(self) -> tuple[str, bytes]:
        address = f"\0nbtrain-relay-{secrets.token_hex(12)}"  # abstract: nothing on disk to remove
        self._server = await asyncio.start_unix_server(self._serve, path=address)
        return address, self._secret

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One rank's connection: its secret, then each push and its one-byte answer."""
        try:
            offered = await asyncio.wait_for(reader.readexactly(len(self._secret)), OPEN_TIMEOUT_S)
            if not hmac.compare_digest(offered, self._secret):
                return
            while True:
                (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
                push = pickle.loads(await reader.readexactly(size))
                try:
                    await self.push(*push)
                except Exception:  # noqa: BLE001 - the rank hears it failed, and resends to the supervisor
                    writer.write(FAILED)
                else:
                    writer.write(LANDED)
                await writer.drain()
        except Exception:  # noqa: BLE001 - the rank's attempt ended, or a connection that is no rank's
            pass  # either way only this connection ends (a rank whose link broke pushes to the supervisor)
        finally:
            writer.close()

    async def push(self, rank: int, attempt: int, seq: int, rows: list[dict[str, Any]],
                   beat: Heartbeat, logs: list[tuple[str, float, str]]) -> None:
        """Hand one rank's push on with the others of its tick; returns once the supervisor took it."""
        tick = self._open
        if tick is None:  # the tick's first push: it sends the tick on when all are in, or soon after
            tick = self._open = _Tick()
            asyncio.get_running_loop().create_task(self._forward(tick))
        tick.pushes.append((rank, attempt, seq, rows, beat, logs))
        if len(tick.pushes) >= self._node_ranks:
            tick.all_in.set()
        await asyncio.shield(tick.landed)

    async def _forward(self, tick: _Tick) -> None:
        try:
            await asyncio.wait_for(tick.all_in.wait(), TICK_GATHER_S)
        except asyncio.TimeoutError:
            pass  # a rank that is late (or has nothing to say) goes with the next tick
        self._open = None
        try:
            await self._supervisor.push_many.remote(tick.pushes)
        except Exception as exc:  # noqa: BLE001 - every rank of the tick hears why, and resends
            tick.landed.set_exception(exc)
        else:
            tick.landed.set_result(None)
