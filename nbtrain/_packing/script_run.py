"""A script made by :mod:`.script` in the notebook, run on a rank: its folder unpacked (once per node) and first on
``sys.path``, ``sys.argv`` its own, the file run as ``__main__`` with ``runpy``; a failing ``sys.exit`` is the
rank's failure with the last lines the script wrote to stderr, and an exception's traceback starts at the
script's own first frame."""

from __future__ import annotations

import collections
import contextlib
import io
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TextIO

from nbtrain._packing.shipping import forget_earlier_versions, unpacked

STDERR_LINES_KEPT = 12  # of a failing script's stderr, in its failure


class ScriptExited(Exception):
    """The script called ``sys.exit`` with a failing code (an argparse error exits with 2): the rank's failure."""


def run_script(script: str, args: tuple[str, ...], archive: bytes, digest: str, shown_path: str) -> None:
    """Run ``script`` (its path inside ``archive``, the zipped folder) as torchrun would, with ``args``."""
    folder = unpacked(archive, "nbtrain-scripts", digest)
    forget_earlier_versions(folder)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, str(folder))
    try:
        with _stderr_tail() as tail:
            try:
                runpy.run_path(str(folder / script), run_name="__main__")
            except Exception as error:  # noqa: BLE001 - the rank's failure, from the script's first line
                raise error.with_traceback(_from_script(error.__traceback__, folder / script)) from error.__cause__
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    said = "".join(tail).rstrip()
                    raise ScriptExited(f"{shown_path} exited with code {exit_.code!r} (sys.exit)"
                                       + (f"; it wrote:\n{said}" if said else ".")) from None
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def _from_script(tb: TracebackType | None, script: Path) -> TracebackType | None:
    """The traceback from the script's own first frame: nbtrain's and runpy's are not the user's to read."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != str(script):
        first = first.tb_next
    return first if first is not None else tb


@contextlib.contextmanager
def _stderr_tail() -> Iterator[collections.deque[str]]:
    """The last lines written to stderr meanwhile (they still go where stderr goes: the rank's log)."""
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)
    saved = sys.stderr
    sys.stderr = _Tee(saved, tail)
    try:
        yield tail
    finally:
        sys.stderr = saved


class _Tee(io.TextIOBase):
    def __init__(self, stream: TextIO, tail: collections.deque[str]) -> None:
        self._stream, self._tail = stream, tail

    def write(self, text: str) -> int:
        self._tail.extend(line for line in text.splitlines(True))
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()
