"""A rank's pushes in flight: through a Ray actor call, or over its node's relay socket.

A Ray actor call costs about a millisecond of CPU on each side (measured on the
2-core test machine), every tick, on every rank. Through its node's push relay
(:mod:`~nbtrain._cluster.relay.push_relay`) a rank needs no Ray call at all: the
relay listens on a Unix socket in Linux's abstract namespace (nothing on disk
to clean up) and the rank sends each push there as one length-prefixed pickle,
then reads a one-byte answer once the supervisor has taken it. A connection
must first send the relay's secret, which ranks get from the relay over Ray,
so only processes Ray authenticated can push.

Both kinds of push answer the same two questions (:class:`Pending`): has it
been answered, and did it land. A socket that breaks reads as a push that did
not land: the rank then sends it again straight to the supervisor, as when a
Ray call to a dead relay fails.
"""

from __future__ import annotations

import pickle
import select
import socket
import struct
import sys
from typing import Any, Protocol

FRAME = struct.Struct("!I")  # a push's pickled size, before its bytes
LANDED, FAILED = b"\x01", b"\x00"
OPEN_TIMEOUT_S = 10.0  # asking the relay for its socket, connecting, and any single send
# Ranks flush on the same wall-clock ticks (see rank.session.until_next_tick); a relay, or the supervisor's long
# poll, woken by the first rank's push of a tick waits this long at most for the others of that tick.
TICK_GATHER_S = 0.05


class RelayGone(ConnectionError):
    """The relay's socket closed, or the relay could not forward the push."""


class Pending(Protocol):
    def wait(self, timeout: float) -> bool:
        """Whether the push has been answered (landed or failed), waiting up to ``timeout`` seconds."""

    def result(self) -> None:
        """Once answered: returns if the push landed at the supervisor, raises if it did not."""


class RayPush:
    """A push sent as a Ray actor call (to the supervisor, or to a relay without a socket)."""

    def __init__(self, ref: Any) -> None:
        self._ref = ref

    def wait(self, timeout: float) -> bool:
        import ray

        ready, _ = ray.wait([self._ref], timeout=timeout)
        return bool(ready)

    def result(self) -> None:
        import ray

        ray.get(self._ref)


class SocketPush:
    """A push sent over the relay socket; its answer is one byte on the same socket."""

    def __init__(self, link: RelayLink) -> None:
        self._link = link
        self._answer: bytes | None = None

    def wait(self, timeout: float) -> bool:
        if self._answer is None:
            self._answer = self._link.answer(timeout)
        return self._answer is not None

    def result(self) -> None:
        if self._answer != LANDED:
            raise RelayGone("the node's push relay did not forward this push")


class RelayLink:
    """A rank's connection to its node's relay socket; one push in flight at a time."""

    def __init__(self, address: str, secret: bytes) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(OPEN_TIMEOUT_S)
        try:
            self._sock.connect(address)
            self._sock.sendall(secret)
        except OSError:
            self._sock.close()
            raise
        self._answers = select.poll()  # not select.select: a rank's process may hold descriptors past 1023
        self._answers.register(self._sock, select.POLLIN)

    def send(self, push: tuple[Any, ...]) -> SocketPush:
        data = pickle.dumps(push, protocol=pickle.HIGHEST_PROTOCOL)
        self._sock.sendall(FRAME.pack(len(data)) + data)
        return SocketPush(self)

    def answer(self, timeout: float) -> bytes | None:
        """The relay's answer to the push in flight: LANDED, FAILED (also for a closed socket), or None if
        none came within ``timeout``."""
        try:
            if not self._answers.poll(max(int(timeout * 1000), 0)):
                return None
            return self._sock.recv(1) or FAILED
        except (OSError, ValueError):  # ValueError: the socket was closed on this side
            return FAILED

    def close(self) -> None:
        self._sock.close()


def open_link(relay: Any) -> RelayLink | None:
    """A socket to ``relay`` if it offers one and it connects; None otherwise (the rank calls ``relay.push``)."""
    if sys.platform != "linux":
        return None
    import ray

    try:
        offer = ray.get(relay.socket_address.remote(), timeout=OPEN_TIMEOUT_S)
        return RelayLink(*offer) if offer else None
    except Exception:  # noqa: BLE001 - a relay that cannot be reached this way is still reached by Ray calls
        return None
