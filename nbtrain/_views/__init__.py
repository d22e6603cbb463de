"""Code that draws, in the notebook kernel: the magics, the live dashboard, the launch panel, static plots, the
plotly figures.

Views read a :class:`~nbtrain.Run`; they never talk to the supervisor themselves.
"""

from __future__ import annotations

from typing import Any

from nbtrain._client import views as _client_views


def _run_dashboard(run: Any, **options: Any) -> Any:
    from nbtrain._views.dashboard.dashboard import show_dashboard

    return show_dashboard(run, **options)


def _sweep_dashboard(sweep: Any) -> Any:
    from nbtrain._views.sweep_dashboard import show_sweep_dashboard

    return show_sweep_dashboard(sweep)


def _post_mortem(*args: Any, **kwargs: Any) -> Any:
    from nbtrain._views.debugging.debugger import post_mortem

    return post_mortem(*args, **kwargs)


def _run_figure(run: Any, metrics: Any = None) -> Any:
    from nbtrain._views.figures import run_figure

    return run_figure(run, metrics)


def _sweep_figure(sweep: Any, best: int = 3) -> Any:
    from nbtrain._views.compare import sweep_figure

    return sweep_figure(sweep, best)


# imported inside each opener: a process that never shows a view (a rank, the CLI) loads no widget code
_client_views.provide(_client_views.RUN_DASHBOARD, _run_dashboard)
_client_views.provide(_client_views.SWEEP_DASHBOARD, _sweep_dashboard)
_client_views.provide(_client_views.POST_MORTEM, _post_mortem)
_client_views.provide(_client_views.RUN_FIGURE, _run_figure)
_client_views.provide(_client_views.SWEEP_FIGURE, _sweep_figure)
