"""What a person sees of a sweep in a real JupyterLab, driven by Chromium.

A notebook cell runs a real ``nbtrain.tune`` on the session's loopback cluster:
ASHA over three trials (2 ranks each, one at a time) whose loss is
``q + 1/step``, the best q first, so ASHA cuts later ones at its first rungs
(trial 1, q = 2, at the first: 3.0 against 1.1).
The cell shows ``sweep.dashboard()``; the lab server's real agent feeds the
sidebar. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import PurePosixPath

import pytest
from test_dashboard_browser import ARTIFACTS, browser_type_launch_args, open_and_run, write_notebook  # noqa: F401

from nbtrain._lab.sidebar_agent import NbtrainServer
from nbtrain._views.dashboard.chart import FADED_OPACITY

from _helpers import wait_for
from _jupyterlab import expect, start_jupyterlab

pytestmark = pytest.mark.browser

SWEEP = "browser-sweep"
GRID = [0.1, 2.0, 3.0]  # trial i has q = GRID[i]; trial 0 is the best at every step
STEPS = 8
SWEEP_CELL = f"""\
import time
from ray import tune
import nbtrain

def train(config):
    for step in range(1, {STEPS} + 1):
        nbtrain.report(loss=config["q"] + 1.0 / step)
        time.sleep(0.4)

sweep = nbtrain.tune(train, space={{"q": tune.grid_search({GRID!r})}}, metric="loss", mode="min",
                     scheduler="asha", max_t={STEPS}, grace_period=1, reduction_factor=2,
                     workers_per_trial=2, max_concurrent=1, name="{SWEEP}")
sweep.dashboard()
"""

# The trials' chart of the sweep dashboard's charts widget (static/charts.js): a trace per trial, its line a
# path.nbtrain-trace and a trial of one report a dot (path.nbtrain-dots), each named "trial <index>".
CURVES = ".nbtrain-sweep-dashboard svg.nbtrain-chart[data-chart=trials]"
TRACES = f"{CURVES} path.nbtrain-trace, {CURVES} path.nbtrain-dots"
# How many trials the live chart draws, and how many points they hold together.
FIGURE = (f"() => {{ const svg = document.querySelector('{CURVES}'); if (!svg) return {{lines: 0, points: 0}};"
          f" const names = new Set([...document.querySelectorAll('{TRACES}')].map(p => p.dataset.name));"
          " return {lines: names.size, points: parseInt(svg.dataset.points || '0')}; }")
# Each trial's state, as the trial table (under the chart) says it: {index: state}.
STATES = ("() => Object.fromEntries([...document.querySelectorAll('.nbtrain-sweep-dashboard tr.trial-row')]"
          ".map(r => [r.cells[0].textContent.trim().split(/\\s+/).pop(),"
          " [...r.classList].find(c => c.startsWith('trial-') && c !== 'trial-row').slice(6)]))")


@pytest.fixture(scope="module")
def lab(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-root")
    write_notebook(root / "sweep.ipynb", ["%load_ext nbtrain\n%ray_connect", SWEEP_CELL])
    # The product's refresh (the server tests turn it off): it is how the sidebar learns of the sweep.
    refresh = NbtrainServer.refresh_interval.default_value
    server = start_jupyterlab(root, server_config={"NbtrainServer": {"refresh_interval": refresh}})
    yield server
    server.stop()


def test_sweep_dashboard_grows_fades_cut_trials_and_the_sidebar_lists_the_trials(page, lab):
    ARTIFACTS.mkdir(exist_ok=True)
    began = time.monotonic()
    try:
        open_and_run(page, lab, "sweep.ipynb")
        page.locator(".jp-nbtrain-Status").click()  # the sidebar, polling while the sweep runs

        # The multi-trial figure grows: more points, then more trials' lines, while the sweep runs.
        page.wait_for_function(f"() => ({FIGURE})().lines > 0", timeout=180_000, polling=200)
        first = page.evaluate(FIGURE)
        page.wait_for_function(f"(first) => {{ const now = ({FIGURE})();"
                               " return now.lines > first.lines && now.points > first.points; }",
                               arg=first, timeout=180_000, polling=200)
        grown = page.evaluate(FIGURE)
        print(f"\n[sweep] figure {first} -> {grown} at {time.monotonic() - began:.1f} s", file=sys.stderr)

        # A trial ASHA cut is drawn faded; the best one stays opaque.
        stopped = page.wait_for_function(
            f"() => {{ const states = ({STATES})();"
            " for (const [index, state] of Object.entries(states)) { if (state !== 'stopped') continue;"
            f"   const l = document.querySelector(`{CURVES} path[data-name=\"trial ${{index}}\"]`);"
            "   if (l && parseFloat(l.getAttribute('stroke-opacity')) < 1"
            "       && parseFloat(getComputedStyle(l).strokeOpacity) < 1) return index; }"
            " return null; }",
            timeout=180_000, polling=200).json_value()
        assert int(stopped) != 0
        header = page.locator(".nbtrain-sweep-dashboard .nbtrain-sweep-header")
        expect(header).to_contain_text(f"Sweep {SWEEP} succeeded", timeout=300_000)
        page.screenshot(path=str(ARTIFACTS / "sweep-dashboard.png"), full_page=True)
        states = {int(index): state for index, state in page.evaluate(STATES).items()}
        lines = page.evaluate(f"() => [...document.querySelectorAll('{TRACES}')]"
                              ".map(l => [l.dataset.name, l.getAttribute('stroke-opacity')])")
        assert sorted(states) == list(range(len(GRID))) and states[0] == "succeeded", states
        assert {int(name.split()[-1]) for name, _ in lines} == set(states), lines
        for name, opacity in lines:  # every trial cut short is faded, every other one is not
            faded = states[int(name.split()[-1])] in ("stopped", "failed")
            assert float(opacity) == (FADED_OPACITY if faded else 1.0), lines

        # The sidebar: the sweep with its state, metric and best value, opening to its trials.
        sidebar = page.locator("#nbtrain-sidebar")
        row = sidebar.locator(f'li.jp-nbtrain-sweep[data-sweep-name="{SWEEP}"]')
        expect(row.locator(".jp-nbtrain-badge").first).to_have_text("succeeded", timeout=60_000)
        best = GRID[0] + 1.0 / STEPS
        expect(row.locator(".jp-nbtrain-sweep-info")).to_contain_text(f"loss (min) · best {best:.4g} (trial 0)")
        trials = row.locator("li.jp-nbtrain-trial")
        expect(trials.first).to_be_hidden()
        row.locator("summary").click()
        expect(trials).to_have_count(len(GRID))
        expect(trials.first).to_be_visible()
        listed = trials.evaluate_all("rows => rows.map(r => [r.dataset.trialIndex, r.dataset.state,"
                                     " r.dataset.runName])")
        assert listed == [[str(i), states[i], f"{SWEEP}-t{i}"] for i in range(len(GRID))]  # as the figure has them
        cut = row.locator(f'li.jp-nbtrain-trial[data-trial-index="{stopped}"]')
        expect(cut.locator(".jp-nbtrain-message")).to_contain_text(re.compile(r"stopped by ASHA at rung \d"))
        expect(row.locator('li.jp-nbtrain-trial[data-trial-index="0"] .jp-nbtrain-metrics')) \
            .to_contain_text(f"best {best:.4g}")
        # A trial's run is listed under its sweep, not among the runs.
        expect(sidebar.locator(f'li.jp-nbtrain-run[data-run-name^="{SWEEP}-t"]')).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "sweep-sidebar.png"), full_page=True)

        # "Open dashboard" of a trial is its run's: the notebook it came from if the server can open it,
        # else attaching to the run in the active notebook.
        # the sweep's badge can say "succeeded" a refresh before its trials' runs are all read as ended
        run = wait_for(lambda: (answer := lab.request("GET", f"nbtrain/api/runs/{SWEEP}-t0")[1])["terminal"]
                       and answer, 30, message="trial 0's run listed as ended")
        notebook = run["notebook"]
        row.locator('li.jp-nbtrain-trial[data-trial-index="0"] .jp-nbtrain-open').click()
        if notebook and not PurePosixPath(notebook).is_absolute() and (lab.root_dir / notebook).exists():
            page.wait_for_function("(path) => window.jupyterapp.shell.currentWidget.context.path === path",
                                   arg=notebook, timeout=20_000)
        else:
            page.wait_for_function(
                "(cell) => window.jupyterapp.shell.currentWidget.content.widgets"
                ".some(c => c.model.sharedModel.getSource().endsWith(cell))", arg=run["attach_cell"], timeout=20_000)
            dashboard = page.locator(".nbtrain-dashboard").filter(has_text=f"{SWEEP}-t0")
            expect(dashboard.locator(".nbtrain-state")).to_have_attribute("data-state", run["state"], timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "sweep-trial-opened.png"), full_page=True)
        print(f"[sweep] whole test {time.monotonic() - began:.1f} s (trial notebook: {notebook!r})", file=sys.stderr)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "sweep-failure.png"), full_page=True)
        print(*[line for line in lab.log().splitlines() if "nbtrain" in line], sep="\n", file=sys.stderr)
        raise
