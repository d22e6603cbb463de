"""How a fallback says that it was taken: one line on the process's stderr, once per process and reason."""

from __future__ import annotations

import sys

_said: set[str] = set()


def say_once(message: str) -> None:
    """Write ``nbtrain: <message>`` to stderr the first time this process meets ``message``.

    On a rank, a supervisor or a warm worker that stderr is the actor's log (``nbtrain logs``); in the
    notebook's kernel it is the cell's output.
    """
    if message not in _said:
        _said.add(message)
        sys.stderr.write(f"nbtrain: {message}\n")


def reason(exc: BaseException) -> str:
    """An exception in one line, for a fallback's message."""
    return f"{type(exc).__name__}: {exc}"
