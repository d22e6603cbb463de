"""The lab sidebar with a real run started from a notebook on the loopback cluster.

``launch()`` records the run once; the server's ``python -m nbtrain agent``
reports what the cluster says of it (no notebook writes anything after the
launch). The run's cell blocks, as users run it (the sidebar's buttons reach the run through the lab server,
whatever the kernel is doing). The sidebar shows the run, its progress grows, the status bar counts
it, its Pause button holds every rank at one step and Resume lets them go on, a
rewind and a patch mark its row, and the sidebar's Stop button stops it for real,
through the same agent; two runs checked in the sidebar are compared in a notebook cell.
"""

from __future__ import annotations

import sys
import time

import pytest
from test_dashboard_browser import ARTIFACTS, browser_type_launch_args, open_and_run, write_notebook  # noqa: F401

import nbtrain
from nbtrain._lab.sidebar_agent import NbtrainServer

from _helpers import wait_for
from _jupyterlab import expect, start_jupyterlab

pytestmark = pytest.mark.browser
NBTRAIN_SIDEBAR = "nbtrain-sidebar"  # the sidebar's widget id (labextension/src/commands.ts SIDEBAR_ID)


@pytest.fixture(scope="module")
def lab(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("sidebar-root")
    write_notebook(root / "sidebar.ipynb", ["%load_ext nbtrain\n%ray_connect", (
        "%%ray_train --workers 2 --name sidebar-live --total-steps 3000\n"
        "import time\n"
        "import torch\n"
        "model = nbtrain.prepare_model(torch.nn.Linear(2, 1))\n"
        "optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))\n"
        "data = torch.utils.data.TensorDataset(torch.randn(12000, 2))\n"
        "for (x,) in nbtrain.prepare_loader(torch.utils.data.DataLoader(data, batch_size=2)):\n"
        "    optimizer.zero_grad()\n"
        "    loss = model(x).pow(2).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    nbtrain.report(loss=loss.item())\n"
        "    if nbtrain.get_context().step % 20 == 0:\n"
        "        nbtrain.save_checkpoint({'model': model.state_dict()})\n"
        "    time.sleep(0.05)\n")])
    # The product's refresh (tests elsewhere turn it off): it is how the sidebar learns of progress.
    refresh = NbtrainServer.refresh_interval.default_value
    server = start_jupyterlab(root, server_config={"NbtrainServer": {"refresh_interval": refresh}})
    yield server
    server.stop()


def _short_run(config):
    for step in range(1, 11):
        nbtrain.report(step=step, loss=2.0 / step)


def _paced_run(config):
    """About 8 s of steps: long enough to be seen running, however the status bar's polls fall."""
    for step in range(1, 41):
        nbtrain.report(step=step, loss=2.0 / step)
        time.sleep(0.2)  # a training step's duration


def test_sidebar_follows_and_stops_a_real_run(page, lab):
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        open_and_run(page, lab, "sidebar.ipynb")
        # The sidebar closed, as most of the time: the status bar counts the run as it starts (issue 55, 8d: it
        # said "0 running" until its next slow poll); a cell that starts makes it poll fast for a while.
        status = page.locator(".jp-nbtrain-Status")
        wait_for(lambda: any(run["name"] == "sidebar-live" for run in nbtrain.runs()), timeout=180,
                 message="the launch to record the run")
        recorded = time.monotonic()
        expect(status).to_contain_text("1 running", timeout=8_000)
        print(f"\n[sidebar] run recorded -> status bar '1 running' in {time.monotonic() - recorded:.1f} s",
              file=sys.stderr)
        status.click()
        row = page.locator('#nbtrain-sidebar li[data-run-name="sidebar-live"]')
        expect(row.locator(".jp-nbtrain-badge")).to_have_text("running", timeout=180_000)
        label = row.locator(".jp-nbtrain-progress-label")
        expect(label).not_to_have_text("step 0/3000", timeout=30_000)
        first = int(label.inner_text().split()[1].split("/")[0])
        expect(label).not_to_have_text(label.inner_text(), timeout=15_000)
        second = int(label.inner_text().split()[1].split("/")[0])
        assert second > first
        page.screenshot(path=str(ARTIFACTS / "sidebar-live.png"), full_page=True)
        row.locator(".jp-nbtrain-pause").click()  # every rank holds at one step; the row says which
        clicked = time.monotonic()
        wait_for(lambda: nbtrain.attach("sidebar-live").summary()["paused_at"] is not None, 60, interval=0.05,
                 message="every rank to pause after the sidebar's Pause click")
        print(f"\n[sidebar] Pause clicked -> run paused in {time.monotonic() - clicked:.2f} s (its cell blocking)",
              file=sys.stderr)
        expect(row.locator(".jp-nbtrain-badge")).to_contain_text("paused at step", timeout=60_000)
        paused_at = nbtrain.attach("sidebar-live").summary()["paused_at"]
        assert paused_at is not None and row.locator(".jp-nbtrain-badge").inner_text() == f"paused at step {paused_at}"
        expect(row.locator(".jp-nbtrain-pause")).to_have_text("Resume")
        page.screenshot(path=str(ARTIFACTS / "sidebar-paused.png"), full_page=True)
        row.locator(".jp-nbtrain-pause").click()
        expect(row.locator(".jp-nbtrain-badge")).to_have_text("running", timeout=60_000)
        assert nbtrain.attach("sidebar-live").summary()["paused_at"] is None
        expect(row.locator(".jp-nbtrain-rewound")).to_be_hidden()
        nbtrain.attach("sidebar-live").rewind(wait=True)  # back to its last checkpoint, in place: the row says so
        expect(row.locator(".jp-nbtrain-rewound")).to_have_text("rewound", timeout=60_000)
        expect(row.locator(".jp-nbtrain-patched")).to_be_hidden()
        nbtrain.attach("sidebar-live").patch("NOTE = 'patched from the test'\n", new=True)  # its code changed
        expect(row.locator(".jp-nbtrain-patched")).to_have_text("patched", timeout=60_000)

        row.locator(".jp-nbtrain-stop").click()
        page.locator(".jp-Dialog").get_by_role("button", name="Stop run").click()
        clicked = time.monotonic()
        wait_for(lambda: nbtrain.attach("sidebar-live").state == nbtrain.RunState.STOPPED, 60, interval=0.05,
                 message="the run to stop after the sidebar's Stop click")
        print(f"\n[sidebar] Stop clicked -> run stopped in {time.monotonic() - clicked:.2f} s", file=sys.stderr)
        expect(row.locator(".jp-nbtrain-badge")).to_have_text("stopped", timeout=60_000)
        print(f"\n[sidebar] Stop clicked -> 'stopped' shown in {time.monotonic() - clicked:.1f} s", file=sys.stderr)
        print(*[line for line in lab.log().splitlines() if "nbtrain:" in line], sep="\n", file=sys.stderr)
        assert nbtrain.attach("sidebar-live").state == nbtrain.RunState.STOPPED
        page.screenshot(path=str(ARTIFACTS / "sidebar-stopped.png"), full_page=True)

        other = nbtrain.launch(_short_run, name="sidebar-other", workers=1)  # a second run to compare with
        assert other.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
        other_row = page.locator('#nbtrain-sidebar li[data-run-name="sidebar-other"]')
        expect(other_row.locator(".jp-nbtrain-badge")).to_have_text("succeeded", timeout=60_000)
        compare = page.locator("#nbtrain-sidebar .jp-nbtrain-compare")
        expect(compare).to_be_disabled()
        row.locator(".jp-nbtrain-select").check()
        other_row.locator(".jp-nbtrain-select").check()
        expect(compare).to_have_text("Compare 2 runs")
        compare.click()  # a cell that compares them goes into the notebook and runs
        summary = page.locator(".nbtrain-compare-summary")
        expect(summary).to_contain_text("sidebar-other", timeout=120_000)
        expect(summary).to_contain_text("sidebar-live")
        page.screenshot(path=str(ARTIFACTS / "sidebar-compare.png"), full_page=True)

        # The sidebar closed again: a run is counted while it goes and dropped as it ends (issue 55, 8d: the status
        # bar said "1 running" after a --bg run had succeeded).
        page.locator(f'.jp-SideBar .lm-TabBar-tab[data-id="{NBTRAIN_SIDEBAR}"]').click()
        expect(page.locator(f"#{NBTRAIN_SIDEBAR}")).to_be_hidden()
        last = nbtrain.launch(_paced_run, name="sidebar-last", workers=1)
        expect(status).to_contain_text("· 1 running", timeout=60_000)
        assert last.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
        ended = time.monotonic()
        expect(status).to_contain_text("· 0 running", timeout=15_000)
        print(f"\n[sidebar] run ended -> status bar '0 running' in {time.monotonic() - ended:.1f} s", file=sys.stderr)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "sidebar-live-failure.png"), full_page=True)
        print(*[line for line in lab.log().splitlines() if "nbtrain" in line], sep="\n", file=sys.stderr)
        for event in nbtrain.attach("sidebar-live").events:  # what the run itself went through
            print(f"[sidebar-live] {event['time']:.1f} {event['kind']}: {event['message']}", file=sys.stderr)
        raise
