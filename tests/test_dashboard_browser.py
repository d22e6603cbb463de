"""What a person sees of %%ray_train in a real JupyterLab, driven by Chromium.

The notebooks connect (``%ray_connect``) to the session's loopback cluster: the
kernel inherits NBTRAIN_HOME, so it reuses that cluster. This module's tests run
the cells of one notebook, one kernel, as a person trying one thing after another
would: each test runs the connect cell and its own cell, and looks only inside
its own cell. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import nbtrain

from _helpers import wait_for
from _jupyterlab import CHROMIUM, CHROMIUM_ARGS, REPO, kernel_env, start_jupyterlab

# Without Playwright or Chromium these tests fail at setup saying what to install (tests/conftest.py).
pytestmark = pytest.mark.browser
ARTIFACTS = REPO / "test-artifacts"
OPEN_NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the tab on show (Lumino hides the others)
NB = "window.jupyterapp.shell.currentWidget.node"  # the same, in the page's JavaScript


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


def write_notebook(path: Path, cells: list[str]) -> None:
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
                  for src in cells],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }))


SETUP = "%load_ext nbtrain\n%ray_connect"


# The cells of dashboards.ipynb, by index: each test runs SETUP and its own.
BACKGROUND, FAILING, MILLION, MANY, STEERED, AFTER_STEERED = 1, 2, 3, 4, 5, 6


def steered_cell(name: str) -> str:
    """A blocking ``%%ray_train`` cell (no ``--bg``) whose run has every control to click: an optimizer (lr),
    a loader and checkpoints (Rewind), and steps slow enough to pause (it ends when its Stop is clicked)."""
    return (f"%%ray_train --workers 2 --name {name}\n"
            "import time\n"
            "import torch\n"
            "model = nbtrain.prepare_model(torch.nn.Linear(2, 1))\n"
            "optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))\n"
            "data = torch.utils.data.TensorDataset(torch.randn(20000, 2))\n"
            "for (x,) in nbtrain.prepare_loader(torch.utils.data.DataLoader(data, batch_size=2)):\n"
            "    optimizer.zero_grad()\n"
            "    loss = model(x).pow(2).mean()\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    nbtrain.report(loss=loss.item(), lr=optimizer.param_groups[0]['lr'])\n"
            "    if nbtrain.get_context().step % 10 == 0:\n"
            "        nbtrain.save_checkpoint({'model': model.state_dict()})\n"
            "    time.sleep(0.1)\n")


def act_while_blocked(page, dashboard, run_name: str) -> dict[str, float]:
    """Click every control of ``dashboard`` (a locator) while its cell blocks, and check each by the run's own
    state, not by the page; the seconds from each click to the run showing it."""
    run = nbtrain.attach(run_name)
    wait_for(lambda: bool(run.summary().get("restore_points")), 180,
             message=f"{run_name} to keep a restore point (its first checkpoint)")
    acted: dict[str, float] = {}

    def timed(control: str, click, done, what: str) -> None:
        click()
        began = time.monotonic()
        wait_for(done, 30, interval=0.05, message=f"{run_name} to show {what} after the {control} click",
                 describe=lambda: {key: run.summary().get(key) for key in ("state", "paused_at", "hyper", "rewinds")})
        acted[control] = time.monotonic() - began

    buttons = dashboard.locator(".nbtrain-controls button")
    timed("Pause", lambda: buttons.filter(has_text="Pause").click(),
          lambda: run.summary().get("paused_at") is not None, "a step every rank is paused at")
    paused_at = run.summary()["paused_at"]
    assert any(f"paused at step {paused_at}" in event["message"] for event in run.events), run.events[-5:]
    timed("Resume", lambda: buttons.filter(has_text="Resume").click(),
          lambda: run.summary().get("paused_at") is None, "its ranks going on")
    lr = dashboard.locator('.nbtrain-controls .nbtrain-field[data-key="lr"] input')

    def type_lr() -> None:
        lr.fill("0.01")
        lr.press("Enter")
        # issue 55's rule: until the run reports the change, the field shows the run's value, marked pending
        shown = lr.input_value()
        assert shown != "0.01" or (run.summary().get("hyper") or {}).get("lr") == [0.01], shown

    timed("lr field", type_lr, lambda: (run.summary().get("hyper") or {}).get("lr") == [0.01], "lr 0.01 on every rank")
    timed("Rewind", lambda: buttons.filter(has_text="Rewind").click(),
          lambda: (run.summary().get("rewinds") or 0) >= 1, "a rewind")
    timed("Stop", lambda: buttons.filter(has_text="Stop").click(),
          lambda: run.summary().get("state") == "stopped", "the run stopped")
    return acted
MANY_STEPS = (1, 2, 3, 8, 30, 60)  # the MANY cell's runs, shown live at once, one dashboard each


@pytest.fixture(scope="module")
def lab(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-root")
    write_notebook(root / "dashboards.ipynb", [SETUP, (
        "%%ray_train --workers 2 --bg --name browser-stop\n"
        "import time\n"
        "for step in range(100000):\n"
        "    nbtrain.report(loss=1.0)\n"
        "    time.sleep(0.05)\n"), (
        "%%ray_train --workers 2 --name browser-fails\n"
        "for step in range(50):\n"
        "    nbtrain.report(loss=1.0)\n"
        "    if rank == 1 and step == 10:\n"
        "        raise ZeroDivisionError('rank one cannot divide')\n"), (
        "%%ray_train --workers 1 --name browser-million\n"
        "import math\n"
        "for step in range(1_000_000):\n"
        "    nbtrain.report(step=step, loss=math.sin(step / 5000.0))\n"), (
        "import nbtrain, time\n"
        "def short(config):\n"
        "    for step in range(config['steps']):\n"
        "        nbtrain.report(loss=1.0 / (step + 1))\n"
        "        time.sleep(0.05)\n"
        f"runs = [nbtrain.launch(short, config={{'steps': n}}, workers=1, name=f'browser-many-{{n}}')\n"
        f"        for n in {MANY_STEPS}]\n"
        "for run in runs:\n"
        "    run.dashboard()\n"
        "for run in runs:\n"
        "    run.wait()\n"), steered_cell("browser-steered"), "print('the cell after the steered run ran')"])
    env, version = kernel_env(tmp_path_factory.mktemp("spec"), default="this")
    server = start_jupyterlab(root, env)
    server.ipykernel = version
    yield server
    server.stop()


def open_notebook(page, lab, notebook: str) -> None:
    """Open ``notebook`` once its kernel is idle. The module's notebooks share one lab, whose workspace
    would restore earlier tests' tabs (each with a dashboard of its own): ``reset`` opens this one alone,
    and every query below starts from the open notebook's node (``shell.currentWidget``). A notebook
    opened again finds the kernel its earlier page started."""
    page.goto(lab.lab_url(f"tree/{notebook}") + "&reset")
    page.wait_for_function(
        "(path) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return w && w.context && w.context.path === path && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle'; }",
        arg=notebook, timeout=120_000)


def open_and_run(page, lab, notebook: str) -> None:
    """Open ``notebook`` and run all its cells."""
    open_notebook(page, lab, notebook)
    # not awaited: the command's promise resolves only when every cell has finished
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def run_cells(page, lab, notebook: str, cells: list[int]) -> None:
    """Open ``notebook`` and run ``cells`` (indices), in order, in its kernel."""
    open_notebook(page, lab, notebook)
    page.evaluate("(cells) => { const panel = window.jupyterapp.shell.currentWidget;"
                  " for (const index of cells) { panel.content.activeCellIndex = index;"
                  " window.jupyterapp.commands.execute('notebook:run-cell'); } }", cells)


def _root(cell: int | None) -> str:
    """JavaScript for where a query starts: the open notebook, or its cell ``cell``. A notebook just
    opened attaches its cells a few at a time: until cell ``cell`` is there, queries start from an
    empty fragment (they find nothing, so a wait goes on waiting instead of failing)."""
    return NB if cell is None else f"({NB}.querySelectorAll('.jp-Cell')[{cell}] ?? new DocumentFragment())"


def _plot(cell: int | None) -> str:
    """JavaScript for the dashboard's first curve chart (an SVG of its charts widget) under ``_root(cell)``."""
    return _root(cell) + ".querySelector('.nbtrain-dashboard svg.nbtrain-chart[data-kind=lines]')"


def wait_for_state(page, state: str, timeout_ms: int, scope: str = ".nbtrain-dashboard",
                   cell: int | None = None) -> None:
    page.wait_for_function(
        "([scope, state]) => { const b = " + _root(cell) + ".querySelector(scope + ' .nbtrain-state');"
        " return b && b.dataset.state === state; }", arg=[scope, state], timeout=timeout_ms, polling=500)


def plot_points(page, cell: int | None = None) -> int:
    """The points the first chart draws now (its traces' together)."""
    return page.evaluate("() => { const p = " + _plot(cell) + "; return p ? parseInt(p.dataset.points || '0') : 0; }")


def worker_steps(page, cell: int) -> dict[str, int]:
    return page.evaluate(
        "() => Object.fromEntries([..." + _root(cell) + ".querySelectorAll('table.nbtrain-workers tbody tr')]"
        ".map(r => [r.dataset.rank, parseInt(r.querySelector('.nbtrain-worker-step').textContent)]))")


def state_badge(page, cell: int) -> str | None:
    return page.evaluate("() => { const b = " + _root(cell) + ".querySelector('.nbtrain-dashboard .nbtrain-state');"
                         " return b ? b.dataset.state : null; }")


def in_cell(page, cell: int, selector: str):
    """``selector`` inside cell ``cell`` of the open notebook (the other cells' saved outputs are not this test's)."""
    return page.locator(f"{OPEN_NOTEBOOK} .jp-Cell").nth(cell).locator(selector)


def test_stop_button_stops_a_background_run(page, lab):
    try:
        run_cells(page, lab, "dashboards.ipynb", [0, BACKGROUND])
        page.wait_for_function("() => { const t = " + _root(BACKGROUND) + ".querySelector("
                               "'table.nbtrain-workers tbody tr .nbtrain-worker-step');"
                               " return t && parseInt(t.textContent) > 0; }", timeout=180_000)
        in_cell(page, BACKGROUND, ".nbtrain-dashboard button").filter(has_text="Stop").click()
        began = time.monotonic()
        wait_for_state(page, "stopped", 30_000, cell=BACKGROUND)
        assert time.monotonic() - began < 20
        page.screenshot(path=str(ARTIFACTS / "dashboard-stopped.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "dashboard-stop-failure.png"), full_page=True)
        raise


def test_failing_rank_opens_its_traceback_pane(page, lab):
    try:
        run_cells(page, lab, "dashboards.ipynb", [0, FAILING])
        wait_for_state(page, "failed", 180_000, cell=FAILING)
        pane = in_cell(page, FAILING, '.nbtrain-log[data-rank="1"]')
        pane.wait_for(state="visible", timeout=20_000)
        assert "ZeroDivisionError: rank one cannot divide" in pane.inner_text()
        assert in_cell(page, FAILING, ".nbtrain-dashboard").filter(has_text="rank 1 log — failed").count() == 1
        page.screenshot(path=str(ARTIFACTS / "dashboard-failed.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "dashboard-failed-failure.png"), full_page=True)
        raise


def test_a_million_point_history_renders_without_freezing(page, lab):
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    try:
        run_cells(page, lab, "dashboards.ipynb", [0, MILLION])
        wait_for_state(page, "succeeded", 300_000, cell=MILLION)
        in_cell(page, MILLION, ".nbtrain-final").first.wait_for(timeout=60_000)
        # the chart draws at the browser's next frame after the last points came:
        # wait until it holds the last step, then check it stayed small and the page answers at once.
        page.wait_for_function("() => { const p = " + _plot(MILLION) + "; return p && p.dataset.last === '999999'; }",
                               timeout=60_000)
        began = time.monotonic()
        drawn = page.evaluate("() => [..." + _plot(MILLION) + ".querySelectorAll('path.nbtrain-trace')]"
                              ".map(t => parseInt(t.dataset.points))")
        answered_ms = (time.monotonic() - began) * 1000
        assert drawn and all(0 < n <= 2000 for n in drawn)
        render_began = time.monotonic()
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        frame_ms = (time.monotonic() - render_began) * 1000
        figure = (f"1,000,000-point history: {sum(drawn)} points drawn, page answered in "
                  f"{answered_ms:.0f} ms, next frames in {frame_ms:.0f} ms")
        print(figure)
        (ARTIFACTS / "million-point-render.txt").write_text(figure + "\n")
        assert frame_ms < 1000
        page.screenshot(path=str(ARTIFACTS / "dashboard-million.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "dashboard-million-failure.png"), full_page=True)
        # what the page said, and what each plot on it holds: the cause, when the plot stays empty
        print("page console:", *console[-80:], sep="\n  ")
        print("charts (id, points, last step):", page.evaluate(
            "() => [...document.querySelectorAll('svg.nbtrain-chart')].map(p => [p.dataset.chart, p.dataset.points,"
            " p.dataset.last])"))
        raise


def test_every_run_of_many_draws_its_curves_from_its_first_rows(page, lab):
    """Runs of 1 to 60 steps shown live at once: each dashboard ends with its curve drawn, none empty."""
    try:
        run_cells(page, lab, "dashboards.ipynb", [0, MANY])
        page.wait_for_function(
            "(n) => { const b = [..." + _root(MANY) + ".querySelectorAll('.nbtrain-dashboard .nbtrain-state')];"
            " return b.length === n && b.every(x => x.dataset.state === 'succeeded'); }",
            arg=len(MANY_STEPS), timeout=300_000, polling=500)
        page.wait_for_function(
            "(n) => { const c = [..." + _root(MANY) + ".querySelectorAll('.nbtrain-dashboard svg.nbtrain-chart')];"
            " return c.length === n && c.every(x => parseInt(x.dataset.points) > 0); }",
            arg=len(MANY_STEPS), timeout=30_000)
        # every run drawn to its last step: a loaded machine draws a run's end a moment after its badge says so
        drawn_to = ("() => [..." + _root(MANY) + ".querySelectorAll('.nbtrain-dashboard svg.nbtrain-chart')]"
                    ".map(x => parseFloat(x.dataset.last)).sort((a, b) => a - b)")
        wait_for(lambda: page.evaluate(drawn_to) == sorted(float(n) for n in MANY_STEPS), 30, interval=0.25,
                 message=f"every run's chart drawn to its last step {MANY_STEPS}",
                 describe=lambda: page.evaluate(drawn_to))
        assert in_cell(page, MANY, ".nbtrain-dashboard").count() == len(MANY_STEPS)  # one each
        page.screenshot(path=str(ARTIFACTS / "dashboard-many.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "dashboard-many-failure.png"), full_page=True)
        raise


def curves_and_worker_table_grow(page, cell: int) -> None:
    """The chart in ``cell`` gains points while both ranks' steps in its worker table go up, the badge running."""
    page.wait_for_function("() => { const p = " + _plot(cell) + ";"
                           " return p && parseInt(p.dataset.points) > 0; }", timeout=180_000)
    first_points, first_steps = plot_points(page, cell), worker_steps(page, cell)

    def grown() -> bool:
        steps = worker_steps(page, cell)
        return (plot_points(page, cell) > first_points and set(steps) == {"0", "1"}
                and all(steps[r] > first_steps.get(r, 0) for r in ("0", "1")))

    wait_for(grown, 30, interval=0.25, message=f"the plot to grow past {first_points} points and both "
             f"ranks' steps past {first_steps}", describe=lambda: (plot_points(page, cell), worker_steps(page, cell)))
    assert state_badge(page, cell) == "running"


def test_the_live_run_grows_and_every_control_acts_while_its_cell_still_runs(page, lab):
    """The default, blocking cell (not --bg): the curves and the worker table grow while it runs; Pause,
    Resume, the lr field, Rewind and Stop each reach the run while the cell's prompt is [*]; the cell queued
    behind it runs only once the run has ended, and the dashboard is left shown once with its final summary."""
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        run_cells(page, lab, "dashboards.ipynb", [0, STEERED, AFTER_STEERED])
        curves_and_worker_table_grow(page, STEERED)
        page.screenshot(path=str(ARTIFACTS / "dashboard-live.png"), full_page=True)
        dashboard = in_cell(page, STEERED, ".nbtrain-dashboard")
        dashboard.locator(".nbtrain-controls").wait_for(timeout=180_000)
        acted = act_while_blocked(page, dashboard, "browser-steered")
        print(f"\n[JupyterLab, ipykernel {lab.ipykernel}] seconds from click to the run acting: "
              + ", ".join(f"{control} {seconds:.2f}" for control, seconds in acted.items()))
        after = in_cell(page, AFTER_STEERED, ".jp-OutputArea-output")
        after.filter(has_text="the cell after the steered run ran").wait_for(timeout=60_000)
        final = in_cell(page, STEERED, ".nbtrain-dashboard .nbtrain-final")
        final.wait_for(timeout=30_000)
        assert "Run browser-steered: stopped" in final.inner_text()
        # shown once: one dashboard, and its static fallback (for front ends without widgets) is not shown here
        assert in_cell(page, STEERED, ".nbtrain-dashboard").count() == 1
        assert in_cell(page, STEERED, ".nbtrain-summary").count() == 0
        page.screenshot(path=str(ARTIFACTS / "dashboard-controls-blocking.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "dashboard-controls-blocking-failure.png"), full_page=True)
        raise
