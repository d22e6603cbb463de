"""What a person sees of the lab extension, in a real JupyterLab in Chromium.

Runs are recorded by nbtrain's own writer (``record_launch``, as ``launch()``
records them) and what their cluster says comes from the fake agent
(``_fake_agent.py``), which answers ``runs --json`` from files the test
writes and marks a run stopped on ``stop``, as ``python -m nbtrain agent``
does on a real cluster. Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from nbtrain._registry import record_connection, record_from_summary, record_launch

from _jupyterlab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    JupyterLab,
    Page,
    PlaywrightTimeoutError,
    expect,
    start_jupyterlab,
)

pytestmark = pytest.mark.browser

ARTIFACTS = REPO / "test-artifacts"

FAKE_AGENT = Path(__file__).with_name("_fake_agent.py")
CLUSTER = "ray://127.0.0.1:10001"

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


def launched(home: Path, name: str, address: str = CLUSTER, *, ago: float = 0.0, notebook: str | None = None) -> None:
    """The registry record ``launch()`` writes, as if it was written ``ago`` seconds ago."""
    with mock.patch.dict(os.environ, {"NBTRAIN_HOME": str(home)}):
        record_launch(name, address, notebook=notebook, workers=2, total_steps=100)
    path = home / "runs" / f"{name}.json"
    record = json.loads(path.read_text())
    write_json(path, {**record, "created": record["created"] - ago, "updated": record["updated"] - ago})


def cluster_says(home: Path, name: str, state: str = "running", address: str = CLUSTER, **summary: Any) -> None:
    """What the (fake) cluster reports of run ``name``: a supervisor summary, as the real CLI reads it."""
    summary = {"name": name, "state": state, "started": time.time(), "ended": None, "world_size": 2,
               "attempt": 1, "step": 0, "total_steps": 100, "latest": {}, "error": None, **summary}
    write_json(home / "fake-cluster" / f"{name}.json", record_from_summary(summary, address))


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
        server_config={"NbtrainServer": {"agent_command": [sys.executable, str(FAKE_AGENT)], "refresh_interval": 0.5}},
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
        except PlaywrightTimeoutError:
            continue
    pytest.fail(f"could not run {label!r} from the command palette")


def cell_sources(page: Page) -> list[str]:
    return page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets"
        ".map(cell => cell.model.sharedModel.getSource())"
    )


def test_sidebar_lists_runs_and_follows_their_cluster(lab_page: Page, lab: JupyterLab, home: Path) -> None:
    page = lab_page
    with mock.patch.dict(os.environ, {"NBTRAIN_HOME": str(home)}):
        record_connection(CLUSTER, "local")
    write_json(home / "fake-cluster" / "clusters.json",
               {CLUSTER: {"nodes": 1, "resources": {"CPU": [2, 2], "GPU": [0, 0]}}})
    launched(home, "cifar", ago=95, notebook="train.ipynb")
    launched(home, "baseline", ago=700)
    launched(home, "broken", ago=300)
    launched(home, "lost", "ray://127.0.0.1:2", ago=200)  # nothing answers there
    # A hand-edited record whose address would run code in the "Open dashboard" cell.
    write_json(home / "runs" / "hostile.json", {"name": "hostile", "state": "running",
                                                "address": "ray://{__import__('os').system('id')}:1"})
    cluster_says(home, "cifar", step=10, latest={"loss": 0.8123, "accuracy": 0.52})
    cluster_says(home, "baseline", "succeeded", step=100, ended=time.time() - 400,
                 latest={"loss": 0.21, "accuracy": 0.93})
    cluster_says(home, "broken", "failed", step=3, total_steps=None, ended=time.time() - 280,
                 error="Rank 1 raised ZeroDivisionError at step 3. Fix the cell and re-run.\nTraceback ...")

    status = page.locator(".jp-nbtrain-Status")
    # cifar; not "lost", whose cluster never answered (it may be gone): counted only as known to be running
    expect(status).to_have_text("Ray: 127.0.0.1:10001 · 1 running", timeout=20_000)

    status.click()  # opens the sidebar
    sidebar = page.locator("#nbtrain-sidebar")
    expect(sidebar).to_be_visible()
    expect(sidebar.locator(".jp-nbtrain-cluster-info")).to_contain_text("2 / 2 used")
    rows = sidebar.locator("li.jp-nbtrain-run")
    expect(rows).to_have_count(5)
    hostile = sidebar.locator('li[data-run-name="hostile"]')
    expect(hostile.locator(".jp-nbtrain-message")).to_have_text(
        "This run cannot be shown: its cluster address \"ray://{__import__('os').system('id')}:1\" is not of the "
        "form ray://host:port or host:port (its record in the run registry).")
    expect(hostile.locator(".jp-nbtrain-open")).to_be_disabled()
    expect(hostile.locator(".jp-nbtrain-stop")).to_be_hidden()
    cifar = sidebar.locator('li[data-run-name="cifar"]')
    expect(cifar.locator(".jp-nbtrain-badge")).to_have_text("running")
    expect(cifar.locator(".jp-nbtrain-progress-label")).to_have_text("step 10/100")
    expect(cifar.locator(".jp-nbtrain-metrics")).to_have_text("loss 0.8123 · accuracy 0.52")
    expect(cifar.locator(".jp-nbtrain-elapsed")).to_contain_text("1m")
    expect(sidebar.locator('li[data-run-name="broken"] .jp-nbtrain-message')).to_contain_text("ZeroDivisionError")
    expect(sidebar.locator('li[data-run-name="baseline"] .jp-nbtrain-stop')).to_be_hidden()
    baseline_fill = sidebar.locator('li[data-run-name="baseline"] .jp-nbtrain-progress-fill')
    assert baseline_fill.evaluate("node => node.style.width") == "100%"
    lost = sidebar.locator('li[data-run-name="lost"] .jp-nbtrain-badge')
    expect(lost).to_have_text("pending?")  # its cluster never answered: the state may be outdated
    assert "not answered" in (lost.get_attribute("title") or "")
    shot(page, "sidebar")

    # The cluster moves on; the sidebar follows without any notebook open.
    cluster_says(home, "cifar", step=60, latest={"loss": 0.4, "accuracy": 0.81})
    launched(home, "resnet", ago=2)
    cluster_says(home, "resnet", "starting", parent={"run": "cifar", "step": 40})  # run.fork() of cifar
    cluster_says(home, "theirs", "running", step=5)  # launched from another machine: no registry record
    expect(cifar.locator(".jp-nbtrain-progress-label")).to_have_text("step 60/100", timeout=10_000)
    expect(cifar.locator(".jp-nbtrain-metrics")).to_have_text("loss 0.4 · accuracy 0.81")
    width = cifar.locator(".jp-nbtrain-progress-fill").evaluate("node => node.style.width")
    assert width == "60%"
    expect(status).to_have_text("Ray: 127.0.0.1:10001 · 3 running")  # cifar, resnet, theirs
    expect(rows).to_have_count(7)
    expect(sidebar.locator('li[data-run-name="theirs"] .jp-nbtrain-badge')).to_have_text("running")
    forked = sidebar.locator('li[data-run-name="resnet"] .jp-nbtrain-parent')
    expect(forked).to_have_text("forked from cifar at step 40")
    expect(cifar.locator(".jp-nbtrain-parent")).to_be_hidden()
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
    launched(home, "longrun", ago=3)
    cluster_says(home, "longrun", step=4)
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
    assert ["stop", "longrun", "--address", CLUSTER] in calls
    assert json.loads((home / "fake-cluster" / "longrun.json").read_text())["state"] == "stopped"
    assert json.loads((home / "runs" / "longrun.json").read_text())["state"] == "pending"  # nobody rewrote it


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
    launched(home, "orphan", "ray://127.0.0.1:1")
    cluster_says(home, "orphan", "succeeded", "ray://127.0.0.1:1", ended=time.time())
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
