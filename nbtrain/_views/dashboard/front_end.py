"""Where a dashboard is shown, and how: which front end runs the kernel, and the one output a dashboard is.

The dashboard is one anywidget everywhere (:mod:`.dashboard_widget`). Jupyter front ends (JupyterLab,
Notebook 7, VS Code, Colab with its custom widget manager) get one MIME bundle per dashboard
(:class:`DashboardOutput`): the widget's view, and HTML for the front ends that show no widgets (nbconvert's
HTML, GitHub's viewer), so a front end shows the richest it can and never both. marimo shows the same widget
through ``marimo.ui.anywidget`` (:func:`marimo_output`), and the threads that update it (the follower's, the
controls') are ``mo.Thread``s, the kind of thread whose widget messages marimo sends on. A terminal IPython
gets the text line (:class:`~nbtrain._views.dashboard.follower.TextProgress`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from nbtrain._client.kernel.shell import in_notebook as in_notebook


def in_marimo() -> bool:
    """A marimo notebook's kernel (``marimo edit`` or ``marimo run``); marimo is imported there already."""
    marimo = sys.modules.get("marimo")
    try:
        return marimo is not None and bool(marimo.running_in_notebook())
    except Exception:  # noqa: BLE001 - an older or broken marimo: not one we can draw in
        return False


def background_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread whose widget updates reach the page: marimo sends only a ``mo.Thread``'s."""
    if in_marimo():
        import marimo

        thread: threading.Thread = marimo.Thread(target=target, name=name, daemon=True)
        return thread
    return threading.Thread(target=target, name=name, daemon=True)


def marimo_output(widget: Any) -> Any:
    import marimo

    return marimo.ui.anywidget(widget)


def running_cell() -> str | None:
    """The id of the notebook cell being run (JupyterLab and Notebook 7 send it with each request)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    header = getattr(shell, "parent_header", None) or {}
    cell = (header.get("metadata") or {}).get("cellId") if isinstance(header, dict) else None
    return str(cell) if cell else None


def execution_count() -> int | None:
    """IPython's count of the cell being run: a view returned by the cell that showed it is not shown again."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return getattr(get_ipython(), "execution_count", None)


class DashboardOutput:
    """One MIME bundle: the widget's view, and ``data`` (HTML) for front ends that show no widgets."""

    def __init__(self, widget: Any, data: str) -> None:
        self.widget, self.data = widget, data

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                             "model_id": self.widget.model_id},
                "text/html": self.data,
                "text/plain": "nbtrain dashboard (a widget; the summary shows where widgets do not)"}
