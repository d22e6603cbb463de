"""The dashboard in Notebook 7 (``jupyter notebook``), as in JupyterLab: the curves grow while a run goes,
and its controls act while its cell blocks, under the other ipykernel major than JupyterLab's test (either
test takes either major with ``NBTRAIN_BROWSER_IPYKERNEL=this`` or ``other``, to time the controls under both). One
run shows both (a second notebook only for the curves took 40 s of the session lane).

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
    act_while_blocked,
    browser_type_launch_args,
    plot_points,
    steered_cell,
    write_notebook,
)

from _helpers import wait_for
from _jupyterlab import kernel_env, start_notebook7

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def notebook7(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("notebook7-root")
    write_notebook(root / "steer7.ipynb", [SETUP, steered_cell("notebook7-steered"),
                                           "print('the cell after the steered run ran')"])
    env, version = kernel_env(tmp_path_factory.mktemp("spec"), default="other")
    server = start_notebook7(root, env=env)
    server.ipykernel = version
    yield server
    server.stop()


def open_and_run_all(page, notebook7, notebook: str) -> None:
    page.goto(notebook7.notebook_url(notebook))
    page.wait_for_function(
        "(path) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return w && w.context && w.context.path === path && w.sessionContext"
        " && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle'; }", arg=notebook, timeout=120_000)
    assert page.evaluate("() => window.jupyterapp.name") == "Jupyter Notebook"
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def curves_grow_with_a_moving_bar(page) -> None:
    """The chart gains points and the progress line (no ``total_steps``) moves, with the steps and time so far."""
    page.wait_for_function("() => { const p = document.querySelector('.nbtrain-dashboard svg.nbtrain-chart');"
                           " return p && parseInt(p.dataset.points) > 0; }", timeout=180_000)
    first = plot_points(page)
    wait_for(lambda: plot_points(page) > first, 30, interval=0.25,
             message=f"the curve to grow past {first} points", describe=lambda: plot_points(page))
    bar = page.locator(".nbtrain-dashboard .nbtrain-progress-indeterminate")
    assert bar.is_visible()
    # read in one evaluation each: the dashboard replaces the bar at each redraw
    at = ("() => { const bar = document.querySelector('.nbtrain-dashboard .nbtrain-progress-indeterminate');"
          " return bar && [bar.style.backgroundPosition, bar.parentElement.textContent]; }")
    stripes, label = page.evaluate(at)
    assert re.search(r"step \d+ · 0:0\d:\d\d", label), label
    wait_for(lambda: (now := page.evaluate(at)) and now[0] != stripes, 30, interval=0.25,
             message="the bar's stripes to move")


def test_curves_grow_and_every_control_acts_while_its_cell_still_runs_in_notebook7(page, notebook7):
    """As tests/test_dashboard_browser.py's tests in JupyterLab, in Notebook 7 under the other ipykernel major."""
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        open_and_run_all(page, notebook7, "steer7.ipynb")
        curves_grow_with_a_moving_bar(page)
        page.screenshot(path=str(ARTIFACTS / "notebook7-live.png"), full_page=True)
        dashboard = page.locator(".nbtrain-dashboard").first
        dashboard.locator(".nbtrain-controls").wait_for(timeout=180_000)
        acted = act_while_blocked(page, dashboard, "notebook7-steered")
        print(f"\n[Notebook 7, ipykernel {notebook7.ipykernel}] seconds from click to the run acting: "
              + ", ".join(f"{control} {seconds:.2f}" for control, seconds in acted.items()))
        page.locator(".jp-OutputArea-output").filter(has_text="the cell after the steered run ran").wait_for(
            timeout=60_000)
        page.wait_for_selector(".nbtrain-dashboard .nbtrain-final", timeout=30_000)
        assert page.locator(".nbtrain-dashboard").count() == 1 and page.locator(".nbtrain-summary").count() == 0
        page.screenshot(path=str(ARTIFACTS / "notebook7-controls-blocking.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "notebook7-failure.png"), full_page=True)
        raise
