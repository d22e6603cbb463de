"""A cell that blocks (``%%ray_train`` without ``--bg``, ``run.wait()``) still serves its widgets' messages.

Each test starts a real kernel, under ipykernel 7 (this interpreter) and 6 (``scripts/ipykernel-venv``),
and talks to it as a front end does, over jupyter_client: a comm opened and messaged while a cell waits
inside :func:`nbtrain._client.kernel.widget_messages.widget_messages_served` is handled before the cell ends, and the
cells queued behind it (Run All) run after it, in their order — or are aborted when it fails.
No cluster: the dashboard's controls clicked in Chromium are tests/test_dashboard_browser.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[1]

RECORDS_COMMS = textwrap.dedent("""
    import comm
    got = []
    def opened(opened_comm, message):
        got.append("open")
        opened_comm.on_msg(lambda m: got.append(m["content"]["data"]["click"]))
    comm.get_comm_manager().register_target("nbtrain-test", opened)
""")

# waits, serving widget messages, until the front end's click arrives (or 60 s pass: the test then fails)
BLOCKS_UNTIL_CLICKED = textwrap.dedent("""
    import time
    from nbtrain._client.kernel.widget_messages import widget_messages_served
    with widget_messages_served() as serve:
        assert serve is not None, "this kernel serves no widget messages while a cell blocks"
        deadline = time.monotonic() + 60
        while "pause" not in got and time.monotonic() < deadline:
            serve()
            time.sleep(0.05)
    print("served while the cell ran:", got)
    {after}
""")


def _kernel_pythons() -> list[Any]:
    other = pytest.param("other", id="other-ipykernel-major")
    return [pytest.param(sys.executable, id="this-ipykernel"), other]


@pytest.fixture(params=_kernel_pythons())
def kernel(request, tmp_path) -> Iterator[tuple[KernelManager, Any, str]]:
    python = request.param
    if python == "other":
        python = subprocess.run([str(REPO / "scripts" / "ipykernel-venv")], capture_output=True, text=True,
                                check=True).stdout.strip()
    spec = tmp_path / "kernels" / "under-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "under test", "language": "python"}))
    manager = KernelManager(kernel_name="under-test")
    manager.kernel_spec_manager.kernel_dirs = [str(tmp_path / "kernels")]
    manager.start_kernel(cwd=str(REPO), env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    version = _run(client, "import ipykernel; print(ipykernel.__version__)")[0]
    try:
        yield manager, client, version
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _run(client: Any, code: str) -> list[str]:
    outputs: list[str] = []
    reply = client.execute_interactive(code, timeout=60, output_hook=lambda m: outputs.append(
        m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(outputs).split()


def _send(client: Any, msg_type: str, content: dict[str, Any]) -> None:
    client.shell_channel.send(client.session.msg(msg_type, content))


def _outputs_until_replies(client: Any, msg_ids: list[str]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Every stdout output (its cell's msg id, its text) and each request's reply status, in arrival order."""
    streams: list[tuple[str, str]] = []
    statuses: dict[str, str] = {}
    while len(statuses) < len(msg_ids):
        reply = client.get_shell_msg(timeout=90)
        statuses[reply["parent_header"]["msg_id"]] = reply["content"]["status"]
    while True:  # the outputs of the cells that replied, all of them published by now (iopub before the reply)
        try:
            message = client.get_iopub_msg(timeout=2)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing more
            break
        # stdout only: ipykernel 7.4's shell channel thread warns "No such comm" on stderr for a comm_msg that
        # it routes before the comm_open just ahead of it was handled (a front end opens a widget long before)
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
            streams.append((message["parent_header"].get("msg_id"), message["content"]["text"]))
    return streams, statuses


def _click_while_blocked(client: Any, after: str) -> tuple[str, str, list[tuple[str, str]], dict[str, str]]:
    _run(client, RECORDS_COMMS)
    blocked = client.execute(BLOCKS_UNTIL_CLICKED.format(after=after))
    queued = client.execute("print('the next cell ran')")  # Run All: sent at once, behind the blocked cell
    comm_id = "c0ffee"
    _send(client, "comm_open", {"comm_id": comm_id, "target_name": "nbtrain-test", "data": {}})
    _send(client, "comm_msg", {"comm_id": comm_id, "data": {"click": "pause"}})
    streams, statuses = _outputs_until_replies(client, [blocked, queued])
    return blocked, queued, streams, statuses


def test_a_blocked_cell_handles_a_click_and_runs_the_next_cell_after_it(kernel):
    _manager, client, version = kernel
    blocked, queued, streams, statuses = _click_while_blocked(client, after="")
    assert statuses == {blocked: "ok", queued: "ok"}, (version, statuses)
    texts = [(cell, text.strip()) for cell, text in streams]
    assert texts == [(blocked, "served while the cell ran: ['open', 'pause']"), (queued, "the next cell ran")], \
        (version, texts)


def test_the_cell_after_a_blocked_cell_that_fails_is_not_run(kernel):
    _manager, client, version = kernel
    blocked, queued, streams, statuses = _click_while_blocked(client, after="raise RuntimeError('the run failed')")
    assert statuses == {blocked: "error", queued: "aborted"}, (version, statuses)
    assert [text.strip() for _cell, text in streams] == ["served while the cell ran: ['open', 'pause']"], version


# a run dashboard's widget whose run records its controls' calls; its comm id printed for the "page" to send to
DASHBOARD_BLOCKS = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, "tests")
    from _recorded_widget import RecordingRun
    from nbtrain._client.kernel.widget_messages import widget_messages_served
    from nbtrain._views.dashboard.dashboard import WidgetDashboard
    run = RecordingRun("blocked")
    view = WidgetDashboard(run)
    view.update()
    print("comm", view.widget.comm.comm_id, flush=True)
    with widget_messages_served() as serve:
        deadline = time.monotonic() + 60
        while not run.calls and time.monotonic() < deadline:
            serve()
            time.sleep(0.05)
    print("called while the cell ran:", run.calls, view.widget.controls["handled"])
""")


def test_a_blocked_cell_serves_its_dashboards_clicks(kernel):
    """The dashboard's page sends each click as an anywidget custom message, a ``comm_msg`` like any widget
    message: a blocked cell's kernel hands it to the dashboard's dispatcher, which calls the run."""
    _manager, client, version = kernel
    blocked = client.execute(DASHBOARD_BLOCKS)
    comm_id = None
    while comm_id is None:
        message = client.get_iopub_msg(timeout=60)
        text = message["content"].get("text", "") if message["msg_type"] == "stream" else ""
        if text.startswith("comm "):
            comm_id = text.split()[1]
    _send(client, "comm_msg", {"comm_id": comm_id, "data": {"method": "custom",
                                                           "content": {"action": "pause", "id": "click-1"}}})
    streams, statuses = _outputs_until_replies(client, [blocked])
    assert statuses == {blocked: "ok"}, (version, statuses)
    assert [text.strip() for _cell, text in streams] == ["called while the cell ran: [('pause', {})] ['click-1']"], \
        (version, streams)


class _Ipykernel7Shape:
    """A stand-in for ipykernel 7's kernel: its shell channel thread forwards over an in-process socket pair."""

    class shell_channel_thread:
        class manager:
            class _shell_channel_to_main:
                to_socket = object()


class _Ipykernel6Shape:
    """A stand-in for ipykernel 6's kernel: a queue that ``do_one_iteration`` takes one message from."""

    def __init__(self) -> None:
        self.shell_handlers: dict[str, Any] = {}

    async def do_one_iteration(self) -> None:
        return None


@pytest.mark.quick
def test_which_kernel_internals_hold_the_messages_is_decided_by_their_shape(monkeypatch):
    from nbtrain._client.kernel import widget_messages as _widget_messages

    assert _widget_messages._shape(_Ipykernel7Shape()) == "socket"
    assert _widget_messages._shape(_Ipykernel6Shape()) == "queue"
    assert _widget_messages._shape(object()) is None  # another kernel: nothing served, and the dashboard says so
    assert _widget_messages._shape(None) is None      # a terminal or a script
    monkeypatch.setenv(_widget_messages.OFF_VARIABLE, "0")
    assert _widget_messages._kernel() is None


class _View:
    closed = False

    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []

    def note_problem(self, message: str, colour: str) -> None:
        self.notes.append((message, colour))


class _EndedRun:
    """A run that has ended, as a wait reads it: its reader's summary and its live views."""

    def __init__(self, views: list[_View]) -> None:
        from nbtrain._client.run.reader import RunReader

        self.name = "ended"
        self.reader = RunReader.__new__(RunReader)
        self.reader._lock, self.reader._views, self.reader._summary = threading.Lock(), views, {"state": "succeeded"}

    def refresh(self, wait_s: float = 0.0) -> None:
        pass


@pytest.mark.quick
@pytest.mark.parametrize("in_a_notebook", [True, False])
def test_a_wait_where_no_widget_message_is_served_says_so_on_the_runs_dashboards(monkeypatch, in_a_notebook):
    """Whatever waits (``%%ray_train``, ``run.wait()``, ``launch(wait=True)``): in a notebook whose kernel's
    internals are not found, the controls would act only after the cell, so its dashboards must not look as if
    they acted; outside a notebook there is no dashboard to warn."""
    from nbtrain._client.kernel import widget_messages
    from nbtrain._client.run import following

    monkeypatch.setattr(following, "in_notebook", lambda: in_a_notebook)
    view = _View()
    assert following.block_until_done(_EndedRun([view]), launched=False) == "succeeded"
    assert view.notes == ([(widget_messages.UNSERVED, "#ff7f0e")] if in_a_notebook else [])
