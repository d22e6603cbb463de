"""Which shell runs this code: a Jupyter kernel (ipykernel, whatever front end drives it) or not."""

from __future__ import annotations


def in_notebook() -> bool:
    """A Jupyter kernel (ipykernel), whatever the front end."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
