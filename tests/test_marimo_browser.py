"""The dashboard in marimo (``marimo run``, driven by Chromium): ``run.dashboard()`` as a cell's last
expression shows the dashboard's one widget, as in Jupyter (header, charts, worker table, controls); the
curve grows while the run goes, and the run's end is drawn.

The app connects to the session's loopback cluster (``marimo run`` inherits NBTRAIN_HOME). marimo renders
anywidgets in a shadow root: Playwright's locators reach into it, ``document.querySelector`` would not.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_dashboard_browser import ARTIFACTS, browser_type_launch_args  # noqa: F401 - a fixture pytest uses

from _helpers import wait_for
from _jupyterlab import free_port

pytestmark = pytest.mark.browser

APP = '''
import marimo

app = marimo.App()


@app.cell
def _():
    import nbtrain

    nbtrain.connect()
    return (nbtrain,)


@app.cell
def _(nbtrain):
    def train(config):
        import time

        for step in range(config["steps"]):
            nbtrain.report(loss=1.0 / (step + 1))
            time.sleep(0.1)

    run = nbtrain.launch(train, config={{"steps": 80}}, workers=1, name="{name}")
    run.dashboard()
    return (run,)


if __name__ == "__main__":
    app.run()
'''


@pytest.fixture
def marimo_app(cluster, tmp_path: Path) -> Any:
    name = f"marimo-live-{secrets.token_hex(3)}"
    app = tmp_path / "live_app.py"
    app.write_text(textwrap.dedent(APP.format(name=name)).lstrip())
    port = free_port()
    log = (tmp_path / "marimo.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "marimo", "run", str(app), "--host", "127.0.0.1", "--port",
                             str(port), "--headless", "--no-token", "--no-sandbox"], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}/"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            return proc.poll() is not None  # ended: said below

    wait_for(answers, 60, interval=0.25, message="marimo run to answer")
    assert proc.poll() is None, (tmp_path / "marimo.log").read_text()
    yield url, name, tmp_path / "marimo.log"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


def test_the_dashboard_is_live_in_marimo(page, marimo_app):
    url, name, log = marimo_app
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        page.goto(url)
        chart = page.locator("svg.nbtrain-chart[data-kind=lines]").first
        chart.wait_for(timeout=180_000)
        wait_for(lambda: int(chart.get_attribute("data-points") or 0) > 0, 120, interval=0.25,
                 message="the first rows drawn")
        first = int(chart.get_attribute("data-points") or 0)
        wait_for(lambda: int(chart.get_attribute("data-points") or 0) > first, 60, interval=0.25,
                 message=f"the curve to grow past {first} points")
        assert page.locator(".nbtrain-dashboard table.nbtrain-workers").count() == 1
        assert page.locator(".nbtrain-dashboard .nbtrain-controls button.nbtrain-stop").count() == 1
        page.screenshot(path=str(ARTIFACTS / "marimo-live.png"), full_page=True)
        page.locator('.nbtrain-state[data-state="succeeded"]').wait_for(timeout=120_000)
        final = page.locator(".nbtrain-dashboard .nbtrain-final")
        final.wait_for(timeout=30_000)
        assert f"Run {name}: succeeded" in final.inner_text()
        assert page.locator(".nbtrain-dashboard").count() == 1, "shown once"
        page.screenshot(path=str(ARTIFACTS / "marimo-succeeded.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "marimo-failure.png"), full_page=True)
        print(log.read_text(errors="replace")[-5000:])
        raise
