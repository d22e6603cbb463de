"""What the client side shows, reached without importing the views: ``nbtrain/_views/__init__.py`` gives each
opener here when the views are loaded (``import nbtrain`` loads them), and ``Run.dashboard()``,
``Sweep.dashboard()``, ``Run.debug()`` and the ``figure()`` methods call them. So ``_client`` never imports
``_views``: the views sit above the client and attach what they draw to its handles
(``tests/test_module_layout.py`` checks the direction)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RUN_DASHBOARD = "the run's dashboard"
SWEEP_DASHBOARD = "the sweep's dashboard"
POST_MORTEM = "the post-mortem debugger"
RUN_FIGURE = "the run's plotly figure"
SWEEP_FIGURE = "the sweep's plotly figure of its best trials"
_openers: dict[str, Callable[..., Any]] = {}


def provide(view: str, opener: Callable[..., Any]) -> None:
    """The views' opener of ``view`` (one of the names above)."""
    _openers[view] = opener


def open_view(view: str, *args: Any, **kwargs: Any) -> Any:
    """Open ``view`` with the views' opener: what it returns (the view shown, or the debugger's end)."""
    return _openers[view](*args, **kwargs)
