"""One progress line that updates in place in a notebook (one output that changes); elsewhere a line each time.

``connect()`` and ``%ray_connect`` say what they wait for every couple of seconds ("Starting a local Ray
cluster… 4 s"); printed line by line, a notebook kept each as an output of its own (a saved tutorial had
eleven). A :func:`progress_line` keeps one: the last thing said stays.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from nbtrain._client.kernel.shell import in_notebook


def progress_line(stream: TextIO | None = None) -> Callable[[str], None]:
    """A function to call with each progress message; each replaces the one before (see the module)."""
    if in_notebook():
        return _InPlaceOutput()
    out = stream or sys.stderr
    return lambda message: print(message, file=out, flush=True)


class _InPlaceOutput:
    """A notebook's output that each message replaces (IPython's display with a ``display_id``)."""

    def __init__(self) -> None:
        self.handle: Any = None

    def __call__(self, message: str) -> None:
        from IPython.display import display

        shown = {"text/plain": message}
        if self.handle is None:
            self.handle = display(shown, raw=True, display_id=True)
        else:
            self.handle.update(shown, raw=True)
