"""What a person sees of the lab extension, in a real JupyterLab in Chromium.

The registry files are written by the test (as kernels would write them) and
the agent is a small script (``_fake_agent.py``) that records its calls and
marks a run stopped, as ``python -m nbtrain agent`` does. Screenshots land in
``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _jupyterlab import CHROMIUM, CHROMIUM_ARGS, REPO, JupyterLab, start_jupyterlab

playwright_api = pytest.importorskip("playwright.sync_api")
Page = playwright_api.Page
expect = playwright_api.expect

pytestmark = pytest.mark.browser

ARTIFACTS = REPO / "test-artifacts"

FAKE_AGENT = Path(__file__).with_name("_fake_agent.py")

EMPTY_NOTEBOOK = {
    "cells": [],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def make_run(name: str, **fields: Any) -> dict[str, Any]:
    now = time.time()
    run = {
        "name": name,
        "state": "running",
        "address": "ray://127.0.0.1:1",  # nothing listens there: attaching fails fast
        "created": now - 95,
        "updated": now,
        "ended": None,
        "notebook": None,
        "workers": 2,
        "attempt": 1,
        "progress": {"step": 10, "total_steps": 100, "fraction": 0.1},
        "latest": {"loss": 0.8123, "accuracy": 0.52},
        "error": None,
    }
    run.update(fields)
    return run


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nbtrain-home")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Iterator[JupyterLab]:
    root = tmp_path_factory.mktemp("root")
    (root / "demo.ipynb").write_text(json.dumps(EMPTY_NOTEBOOK))
    (root / "train.ipynb").write_text(json.dumps(EMPTY_NOTEBOOK))
    server = start_jupyterlab(
        root,
        env={"NBTRAIN_HOME": str(home)},
        server_config={"NbtrainServer": {"agent_command": [sys.executable, str(FAKE_AGENT)]}},
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lab_page(browser: Any, lab: JupyterLab) -> Iterator[Page]:
    """One JupyterLab page for the module: loading it is the slow part."""
    context = browser.new_context(viewport={"width": 1400, "height": 850})
    page = context.new_page()
    page.goto(lab.lab_url("tree/demo.ipynb"))
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.context"
        " && window.jupyterapp.shell.currentWidget.context.isReady"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.status === 'idle'",
        timeout=60_000,
    )
    yield page
    context.close()


@pytest.fixture(autouse=True)
def screenshot_at_end(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "lab_page" in request.fixturenames:
        shot(request.getfixturevalue("lab_page"), f"{request.node.name}-end")  # look at it when a test fails


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"labextension-{name}.png"))


def run_from_palette(page: Page, label: str) -> None:
    """Type ``label`` into the command palette and run the matching item."""
    palette = page.locator("#command-palette")
    for _attempt in range(3):
        # JupyterLab may still move focus around after start-up, which closes
        # the modal palette; open it again when that happens.
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:activate-command-palette')")
        expect(palette).to_be_visible()
        try:
            palette.locator("input").fill(label.lower(), timeout=3000)
            palette.locator(".lm-CommandPalette-item", has_text=label).click(timeout=3000)
            return
        except playwright_api.TimeoutError:
            continue
    pytest.fail(f"could not run {label!r} from the command palette")


def cell_sources(page: Page) -> list[str]:
    return page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".map(cell => cell.model.sharedModel.getSource())"
    )


def test_sidebar_lists_runs_and_follows_the_registry(lab_page: Page, lab: JupyterLab, home: Path) -> None:
    page = lab_page
    write_json(
        home / "cluster.json",
        {
            "address": "ray://127.0.0.1:10001",
            "kind": "local",
            "nodes": 1,
            "resources": {"CPU": [2, 2], "GPU": [0, 0]},
            "updated": time.time(),
        },
    )
    write_json(home / "runs" / "cifar.json", make_run("cifar", notebook="train.ipynb"))
    write_json(
        home / "runs" / "baseline.json",
        make_run(
            "baseline",
            state="succeeded",
            created=time.time() - 700,
            ended=time.time() - 400,
            progress={"step": 100, "total_steps": 100, "fraction": 1.0},
            latest={"loss": 0.21, "accuracy": 0.93},
        ),
    )
    write_json(
        home / "runs" / "broken.json",
        make_run(
            "broken",
            state="failed",
            created=time.time() - 300,
            ended=time.time() - 280,
            progress={"step": 3, "total_steps": None, "fraction": None},
            error="Rank 1 raised ZeroDivisionError at step 3. Fix the cell and re-run.",
        ),
    )

    status = page.locator(".jp-nbtrain-Status")
    expect(status).to_have_text("Ray: 127.0.0.1:10001 · 1 running", timeout=20_000)

    status.click()  # opens the sidebar
    sidebar = page.locator("#nbtrain-sidebar")
    expect(sidebar).to_be_visible()
    expect(sidebar.locator(".jp-nbtrain-cluster-info")).to_contain_text("2 / 2 used")
    rows = sidebar.locator("li.jp-nbtrain-run")
    expect(rows).to_have_count(3)
    cifar = sidebar.locator('li[data-run-name="cifar"]')
    expect(cifar.locator(".jp-nbtrain-badge")).to_have_text("running")
    expect(cifar.locator(".jp-nbtrain-progress-label")).to_have_text("step 10/100")
    expect(cifar.locator(".jp-nbtrain-metrics")).to_have_text("loss 0.8123 · accuracy 0.52")
    expect(cifar.locator(".jp-nbtrain-elapsed")).to_contain_text("1m")
    expect(sidebar.locator('li[data-run-name="broken"] .jp-nbtrain-message')).to_contain_text("ZeroDivisionError")
    expect(sidebar.locator('li[data-run-name="baseline"] .jp-nbtrain-stop')).to_be_hidden()
    shot(page, "sidebar")

    # The kernel mirrors progress into the registry; the sidebar follows.
    write_json(
        home / "runs" / "cifar.json",
        make_run("cifar", notebook="train.ipynb", progress={"step": 60, "total_steps": 100, "fraction": 0.6},
                 latest={"loss": 0.4, "accuracy": 0.81}),
    )
    write_json(home / "runs" / "resnet.json", make_run("resnet", state="starting", created=time.time() - 2))
    expect(cifar.locator(".jp-nbtrain-progress-label")).to_have_text("step 60/100", timeout=10_000)
    expect(cifar.locator(".jp-nbtrain-metrics")).to_have_text("loss 0.4 · accuracy 0.81")
    width = cifar.locator(".jp-nbtrain-progress-fill").evaluate("node => node.style.width")
    assert width == "60%"
    expect(status).to_have_text("Ray: 127.0.0.1:10001 · 2 running")
    expect(rows).to_have_count(4)
    shot(page, "sidebar-updated")

    # "Open dashboard" opens the notebook the run came from.
    cifar.locator(".jp-nbtrain-open").click()
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.context"
        " && window.jupyterapp.shell.currentWidget.context.path === 'train.ipynb'",
        timeout=20_000,
    )


def test_stop_button_stops_the_run(lab_page: Page, lab: JupyterLab, home: Path) -> None:
    page = lab_page
    write_json(home / "runs" / "longrun.json", make_run("longrun", created=time.time() - 3))
    page.locator(".jp-nbtrain-Status").click()
    row = page.locator('#nbtrain-sidebar li[data-run-name="longrun"]')
    expect(row.locator(".jp-nbtrain-badge")).to_have_text("running", timeout=10_000)

    row.locator(".jp-nbtrain-stop").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text('Stop run "longrun"?')
    shot(page, "stop-dialog")
    dialog.get_by_role("button", name="Stop run").click()

    expect(row.locator(".jp-nbtrain-badge")).to_have_text("stopped", timeout=15_000)
    expect(row.locator(".jp-nbtrain-stop")).to_be_hidden()
    calls = [json.loads(line)["argv"] for line in (home / "calls.jsonl").read_text().splitlines()]
    assert ["stop", "longrun", "--address", "ray://127.0.0.1:1"] in calls
    assert json.loads((home / "runs" / "longrun.json").read_text())["state"] == "stopped"


def test_insert_training_cell_from_the_command_palette(lab_page: Page) -> None:
    page = lab_page
    run_from_palette(page, "nbtrain: Insert training cell")

    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".some(cell => cell.model.sharedModel.getSource().startsWith('%%ray_train'))",
        timeout=10_000,
    )
    (source,) = [s for s in cell_sources(page) if s.startswith("%%ray_train")]
    assert source.splitlines()[0] == "%%ray_train --workers 2 --config lr=0.01 epochs=2"
    for name in ("nbtrain.prepare_model(", "nbtrain.prepare_loader(", "nbtrain.report("):
        assert name in source
    compile(source.split("\n", 1)[1], "<training cell>", "exec")  # the body is valid Python
    shot(page, "training-cell")


def test_connect_command_asks_for_an_address(lab_page: Page) -> None:
    page = lab_page
    page.evaluate("() => { window.jupyterapp.commands.execute('nbtrain:connect'); }")
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Connect to a Ray cluster")
    dialog.locator("input").fill("ray://127.0.0.1:1")
    dialog.get_by_role("button", name="Connect").click()

    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".some(cell => cell.model.sharedModel.getSource().includes('%ray_connect'))",
        timeout=10_000,
    )
    assert "%load_ext nbtrain\n%ray_connect ray://127.0.0.1:1" in cell_sources(page)


def test_open_dashboard_of_a_run_without_notebook_attaches_here(lab_page: Page, home: Path) -> None:
    page = lab_page
    write_json(home / "runs" / "orphan.json", make_run("orphan", state="succeeded", ended=time.time()))
    page.locator(".jp-nbtrain-Status").click()
    page.locator('#nbtrain-sidebar li[data-run-name="orphan"] .jp-nbtrain-open').click()

    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".some(cell => cell.model.sharedModel.getSource().endsWith('%ray_attach orphan'))",
        timeout=10_000,
    )
    # This notebook already loads nbtrain (previous test), so no second %load_ext.
    assert "%ray_connect ray://127.0.0.1:1\n%ray_attach orphan" in cell_sources(page)


def test_commands_are_in_the_palette(lab_page: Page) -> None:
    labels = lab_page.evaluate(
        "() => ['nbtrain:connect', 'nbtrain:insert-training-cell', 'nbtrain:open-tutorials']"
        ".map(id => window.jupyterapp.commands.label(id))"
    )
    assert labels == ["nbtrain: Connect to cluster…", "nbtrain: Insert training cell", "nbtrain: Open tutorials"]
