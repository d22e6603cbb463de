"""The launch panel in a real JupyterLab: fill the form, click Launch, the run matches the form."""

from __future__ import annotations

import ast
from typing import Any

import pytest
from test_dashboard_browser import (  # noqa: F401 - browser_type_launch_args is a fixture
    ARTIFACTS,
    browser_type_launch_args,
    open_and_run,
    wait_for_state,
    write_notebook,
)

import nbtrain

from _helpers import wait_for
from _jupyterlab import start_jupyterlab

pytestmark = pytest.mark.browser

PANEL_CELL = '''import time
def train(config):
    for step in range(config["epochs"] * 10):
        nbtrain.report(loss=1.0 / (step + 1))
        time.sleep(0.05)

panel = nbtrain.LaunchPanel(train, config={"lr": 0.01, "epochs": 3, "optimizer": ["sgd", "adam"]})
panel'''


@pytest.fixture(scope="module")
def lab(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("panel-root")
    write_notebook(root / "panel.ipynb", ["import nbtrain\n%load_ext nbtrain\n%ray_connect", PANEL_CELL])
    server = start_jupyterlab(root)
    yield server
    server.stop()


def kernel_form(page) -> Any:
    """What the kernel's ``panel`` holds now: (workers, hyperparameters, run name).

    Asked of the notebook's kernel itself, after the widget updates the page sent
    before (the kernel handles its messages in order), so a match means Launch
    will read these values.
    """
    reply = page.evaluate(
        "async (expression) => {"
        " const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;"
        " const future = kernel.requestExecute({code: '', silent: true, store_history: false,"
        "                                        user_expressions: {form: expression}});"
        " const done = await future.done;"
        " return done.content.user_expressions.form; }",
        "(panel.workers.value, panel.values(), panel.name.value)")
    if reply["status"] != "ok":
        return f"{reply['ename']}: {reply['evalue']}"
    return ast.literal_eval(reply["data"]["text/plain"])


def test_form_values_reach_the_run(page, lab):
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        open_and_run(page, lab, "panel.ipynb")
        panel = page.locator(".nbtrain-launch-panel")
        panel.wait_for(timeout=180_000)
        handle = panel.locator(".noUi-handle").first  # the workers slider: 2 → 1
        handle.focus()
        page.keyboard.press("ArrowLeft")
        epochs = panel.locator(".widget-inline-hbox", has_text="epochs").locator("input")
        epochs.fill("4")
        epochs.press("Enter")
        panel.locator(".widget-inline-hbox", has_text="optimizer").locator("select").select_option("adam")
        name = panel.locator(".widget-inline-hbox", has_text="run name").locator("input")
        name.fill("panel-browser")
        name.press("Enter")
        form = (1, {"lr": 0.01, "epochs": 4, "optimizer": "adam"}, "panel-browser")
        wait_for(lambda: kernel_form(page) == form, 30, message=f"the kernel's LaunchPanel to hold {form}",
                 describe=lambda: kernel_form(page))
        panel.locator("button", has_text="Launch").click()
        page.locator(".nbtrain-launch-panel .nbtrain-dashboard").wait_for(timeout=60_000)
        run = nbtrain.attach("panel-browser")
        assert run.config == {"lr": 0.01, "epochs": 4, "optimizer": "adam"}
        assert run.summary()["world_size"] == 1
        wait_for_state(page, "succeeded", 120_000, scope=".nbtrain-launch-panel")
        page.screenshot(path=str(ARTIFACTS / "launch-panel.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "launch-panel-failure.png"), full_page=True)
        raise
