"""Which shell runs this code (a Jupyter kernel, whatever front end drives it, or not); what a magic's line means."""

from __future__ import annotations


def in_notebook() -> bool:
    """A Jupyter kernel (ipykernel), whatever the front end."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def without_comment(line: str) -> str:
    """A magic's line without a trailing ``# comment``, the user's note, as users paste magics from docs:
    ``line`` up to a ``#`` that starts a word outside quotes (``--token a#b`` keeps its ``#``)."""
    quote = None
    for at, char in enumerate(line):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and (at == 0 or line[at - 1].isspace()):
            return line[:at].rstrip()
    return line
