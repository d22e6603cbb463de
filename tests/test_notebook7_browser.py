"""The dashboard in Notebook 7 (``jupyter notebook``), as in JupyterLab: the curves grow while a run goes.

The notebook connects to the session's loopback cluster (the kernel inherits
NBTRAIN_HOME). The run has no ``total_steps``, so the progress line shows
steps, elapsed time and a moving bar instead of a bar stuck at empty.
"""

from __future__ import annotations

import re

import pytest
from test_dashboard_browser import (  # noqa: F401 - the fixture is used by pytest-playwright
    ARTIFACTS,
    SETUP,
    browser_type_launch_args,
    plot_points,
    wait_for_state,
    write_notebook,
)

from _helpers import wait_for
from _jupyterlab import start_notebook7

pytestmark = [pytest.mark.browser, pytest.mark.cluster]


@pytest.fixture(scope="module")
def notebook7(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("notebook7-root")
    write_notebook(root / "live7.ipynb", [SETUP, (
        "%%ray_train --workers 2 --name notebook7-live\n"
        "import time\n"
        "for step in range(60):\n"
        "    nbtrain.report(loss=1.0 / (step + 1))\n"
        "    time.sleep(0.2)\n")])
    server = start_notebook7(root)
    yield server
    server.stop()


def test_curves_grow_in_notebook7(page, notebook7):
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        page.goto(notebook7.notebook_url("live7.ipynb"))
        page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " return w && w.context && w.context.path === 'live7.ipynb' && w.sessionContext"
            " && w.sessionContext.session && w.sessionContext.session.kernel"
            " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
        assert page.evaluate("() => window.jupyterapp.name") == "Jupyter Notebook"
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        page.wait_for_function("() => { const p = document.querySelector('.nbtrain-dashboard svg.nbtrain-chart');"
                               " return p && parseInt(p.dataset.points) > 0; }", timeout=180_000)
        first = plot_points(page)
        wait_for(lambda: plot_points(page) > first, 30, interval=0.25,
                 message=f"the curve to grow past {first} points", describe=lambda: plot_points(page))
        bar = page.locator(".nbtrain-dashboard .nbtrain-progress-indeterminate")
        assert bar.is_visible()  # no total_steps: a moving bar, the steps and the time so far
        # read in one evaluation each: the dashboard replaces the bar at each redraw
        at = ("() => { const bar = document.querySelector('.nbtrain-dashboard .nbtrain-progress-indeterminate');"
              " return bar && [bar.style.backgroundPosition, bar.parentElement.textContent]; }")
        stripes, label = page.evaluate(at)
        assert re.search(r"step \d+ · 0:00:\d\d", label), label
        wait_for(lambda: (now := page.evaluate(at)) and now[0] != stripes, 30, interval=0.25,
                 message="the bar's stripes to move")
        page.screenshot(path=str(ARTIFACTS / "notebook7-live.png"), full_page=True)
        wait_for_state(page, "succeeded", 120_000)
        page.wait_for_selector(".nbtrain-dashboard .nbtrain-final", timeout=30_000)
        assert page.locator(".nbtrain-dashboard").count() == 1 and page.locator(".nbtrain-summary").count() == 0
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "notebook7-failure.png"), full_page=True)
        raise
