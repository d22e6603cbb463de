"""What a rank prints goes to its log pane (the session's pushes carry it) and still to Ray's log file."""

from __future__ import annotations

import collections
import io
import time
from typing import Any


class LogTee(io.TextIOBase):
    """Keeps what a rank prints (for its log pane) and still writes it to Ray's log file."""

    def __init__(self, logs: collections.deque[tuple[str, float, str]], stream: str, original: Any) -> None:
        self._logs = logs  # the session's: the flusher sends them
        self._stream = stream
        self._original = original

    def write(self, text: str) -> int:
        if text:
            self._logs.append((self._stream, time.time(), text))
            try:
                self._original.write(text)
            except Exception:  # noqa: BLE001 - a closed Ray log must not break training
                pass
        return len(text)

    def flush(self) -> None:
        try:
            self._original.flush()
        except Exception:  # noqa: BLE001
            pass

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"
