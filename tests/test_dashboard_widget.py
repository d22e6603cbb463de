"""The run dashboard is one widget: what its traits hold, what a click on the page calls on the run, what it
keeps when saved.

No cluster, no browser: a :class:`RecordingRun` stands in for the run (its controls' calls recorded), and the
widget keeps the custom messages it would send (:class:`RecordedDashboard`). The page's side is
tests/js/dashboard.test.mjs; the same clicks in Chromium against a real run are tests/test_dashboard_browser.py's.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from nbtrain._views.dashboard.dashboard import WidgetDashboard
from nbtrain._views.dashboard.dashboard_widget import LOG_PANE_CHARS, LOG_SNAPSHOT_CHARS

from _recorded_widget import RecordedDashboard, RecordingRun

pytestmark = pytest.mark.quick

SAVED_LIMIT = 300 * 1024  # what one finished dashboard may add to a notebook saved with widget state


def run_now(call: Any) -> None:
    call()


def dashboard_of(run: RecordingRun, **options: Any) -> WidgetDashboard:
    view = WidgetDashboard(run, widget=RecordedDashboard(), start=run_now, **options)
    view.update()
    return view


def rows(ranks: int, steps: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"rank": r, "step": s, "attempt": 1, "time": float(s), "loss": 1.0 / (s + 1), "accuracy": s / 1e4}
            for s in range(start, start + steps) for r in range(ranks)]


def test_every_part_of_the_dashboard_is_a_trait_of_one_widget():
    run = RecordingRun("parts", total_steps=40, workers=[
        {"rank": r, "node": "127.0.0.1", "pid": 10 + r, "device": "cpu", "state": "running", "step": 10}
        for r in (0, 1)])
    run.rows = rows(2, 10)
    view = dashboard_of(run)
    widget = view.widget

    assert 'data-state="running"' in widget.header and "<b" in widget.header
    assert widget.progress == {"fraction": 0.25, "style": "", "label": " 25% · ETA 0:00:30"}
    assert '<tr data-rank="1">' in widget.workers["table"] and widget.workers["pager"] is None
    assert widget.ranks == {"shown": False, "value": "", "error": ""}
    assert widget.titles() == ["accuracy", "loss"]
    assert [field["key"] for field in widget.controls["fields"]] == ["lr", "momentum"]
    assert widget.controls["fields"][0] == {"key": "lr", "value": "0.1", "tooltip": "lr"}
    assert widget.controls["live"] and widget.controls["rewind"]["placeholder"] == "latest (10)"
    assert widget.final == "" and widget.log_panes == []


def test_a_click_on_the_page_reaches_the_run_through_the_widgets_comm_and_says_what_happened():
    run = RecordingRun()
    view = dashboard_of(run)

    view.widget.from_page({"action": "checkpoint", "id": "m1"})

    assert run.calls == [("checkpoint_now", {})]
    assert view.widget.notice == {"text": "checkpoint asked (step 11)", "colour": "#2ca02c"}
    assert view.widget.controls["handled"] == ["m1"], "the page's own pending mark goes once the kernel took it"
    assert view.widget.controls["pending"] == {}, "done once the call returned"


@pytest.mark.parametrize(("message", "call"), [
    ({"action": "adjust", "key": "lr", "value": "0.01"}, ("adjust", {"lr": 0.01})),
    ({"action": "adjust", "key": "betas", "value": "(0.9, 0.95)"}, ("adjust", {"betas": (0.9, 0.95)})),
    ({"action": "adjust", "key": "grad_clip", "value": "off"}, ("adjust", {"grad_clip": None})),
    ({"action": "pause"}, ("pause", {})),
    ({"action": "resume"}, ("resume", {})),
    ({"action": "rewind", "step": "", "skip": "0"}, ("rewind", {"step": None, "skip_batches": 0})),
    ({"action": "rewind", "step": "40", "skip": "2"}, ("rewind", {"step": 40, "skip_batches": 2})),
    ({"action": "stop"}, ("stop", {})),
    ({"action": "stacks"}, ("stacks", {})),
    ({"action": "profile"}, ("profile", {"steps": 10})),
], ids=lambda value: value.get("action", "") + value.get("key", "") if isinstance(value, dict) else "")
def test_each_action_calls_what_a_cell_would(message, call):
    run = RecordingRun()
    view = dashboard_of(run)
    view.act(message)
    assert run.calls == [call]


def test_a_setting_stays_pending_and_its_field_shows_the_runs_value_until_the_run_reports_it():
    run = RecordingRun()
    view = dashboard_of(run)

    view.act({"action": "adjust", "key": "lr", "value": "0.01", "id": "a"})

    assert view.widget.notice["text"] == "lr → 0.01 asked (step 12)"
    assert view.widget.controls["pending"] == {"lr": "0.01"}, "asked, not yet seen on the ranks"
    assert view.widget.controls["fields"][0]["value"] == "0.1", "the run's value, not the typed one"
    view.update()
    assert view.widget.controls["pending"] == {"lr": "0.01"}
    run.summary["hyper"] = {"lr": [0.01], "momentum": [0.9]}
    view.update()
    assert view.widget.controls["pending"] == {}
    assert view.widget.controls["fields"][0]["value"] == "0.01"


def test_pause_is_pending_until_the_run_says_the_step_it_paused_at():
    run = RecordingRun()
    view = dashboard_of(run)
    view.act({"action": "pause"})
    assert view.widget.controls["pending"] == {"pause": ""} and not view.widget.controls["paused"]
    run.summary["paused_at"] = 11
    view.update()
    assert view.widget.controls["pending"] == {} and view.widget.controls["paused"]
    assert "paused at step 11" in view.widget.header


def test_a_refusal_or_a_bad_value_is_said_and_nothing_stays_pending():
    run = RecordingRun()
    run.answers["rewind"] = RuntimeError("Rewind needs a restore point on every rank; none yet. Save a checkpoint.")
    view = dashboard_of(run)

    view.act({"action": "adjust", "key": "lr", "value": "fast"})
    assert view.widget.notice["text"] == "lr: 'fast' is not a number; nothing was changed."
    view.act({"action": "rewind", "step": "latest", "skip": "0"})
    assert view.widget.notice["text"].startswith("Rewind: the step must be a whole number")
    view.act({"action": "adjust", "key": "lr; import os", "value": "1"})
    assert "is not a setting a run can change" in view.widget.notice["text"]
    assert run.calls == []

    view.act({"action": "rewind", "step": "", "skip": "0"})
    assert view.widget.notice["text"].startswith("Rewind needs a restore point")
    view.act({"action": "explode"})
    assert "does not know ('explode')" in view.widget.notice["text"]
    assert view.widget.controls["pending"] == {}


def test_stacks_and_a_profile_show_under_the_row():
    run = RecordingRun()
    view = dashboard_of(run)
    view.act({"action": "stacks"})
    assert view.widget.answer == "<pre>stacks compact=True</pre>"
    view.act({"action": "profile"})
    assert view.widget.answer == "<table>top 10</table>"


def test_a_call_runs_off_the_kernels_message_thread():
    """The click's handler returns at once; the call (which may wait on the cluster) runs on a thread of its own."""
    run = RecordingRun()
    release, called_on = threading.Event(), []

    def slow_pause() -> int:
        called_on.append(threading.current_thread().name)
        release.wait(10)
        return 11

    run.pause = slow_pause  # type: ignore[method-assign]
    view = WidgetDashboard(run, widget=RecordedDashboard())
    view.update()
    view.act({"action": "pause"})
    assert view.widget.controls["pending"] == {"pause": ""}
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "nbtrain-control-recorded"]:
        thread.join(10)
    assert called_on == ["nbtrain-control-recorded"]


def test_logs_go_to_a_pane_per_rank_as_increments_and_a_failing_ranks_traceback_opens_its_pane():
    run = RecordingRun()
    run.logs = [{"rank": 0, "text": "epoch 1\n"}, {"rank": 1, "text": "warming up\n"}]
    view = dashboard_of(run)
    assert [part for message, _ in view.widget.sent if message["kind"] == "logs" for part in message["parts"]] == [
        {"rank": 0, "text": "epoch 1\n", "mode": "append"}, {"rank": 1, "text": "warming up\n", "mode": "append"}]
    assert [pane["title"] for pane in view.widget.log_panes] == ["rank 0 log", "rank 1 log"]

    run.logs.append({"rank": 0, "text": "epoch 2\n"})
    traceback = "Traceback (most recent call last):\nZeroDivisionError: boom"
    run.summary.update(state="failed", failures=[{"rank": 1, "attempt": 1, "kind": "raised", "traceback": traceback}])
    view.update()

    logs = [message for message, _ in view.widget.sent if message["kind"] == "logs"]
    assert logs[-1]["parts"] == [{"rank": 0, "text": "epoch 2\n", "mode": "append"},
                                 {"rank": 1, "text": "\n" + traceback, "mode": "append"}]
    assert view.widget.log_panes[1] == {"rank": 1, "title": "rank 1 log — failed", "failed": True, "open": True}
    assert view.widget.log_text(1).endswith("ZeroDivisionError: boom")
    assert "%ray_debug recorded --rank 1" in view.widget.debug_hint
    view.update()
    assert view.widget.log_text(1).count("ZeroDivisionError") == 1, "the traceback is added once"


def test_a_pane_keeps_its_last_characters_and_a_new_view_is_sent_every_pane_whole():
    run = RecordingRun()
    run.logs = [{"rank": 0, "text": "x" * (LOG_PANE_CHARS - 10)}, {"rank": 0, "text": "0123456789abc"}]
    view = dashboard_of(run)
    assert len(view.widget.log_text(0)) == LOG_PANE_CHARS and view.widget.log_text(0).endswith("abc")
    view.widget.sent.clear()
    view.widget.from_page({"kind": "hello"})
    [(logs, _)] = [(m, b) for m, b in view.widget.sent if m["kind"] == "logs"]
    assert logs["parts"] == [{"rank": 0, "text": view.widget.log_text(0), "mode": "replace"}]


def saved_state(widget: Any) -> str:
    """The widget's state as a notebook saved with widget state stores it (ipywidgets' embed format: the traits,
    bytes as base64 buffers; the ES module and CSS included)."""
    from ipywidgets.embed import dependency_state

    return json.dumps(dependency_state([widget], drop_defaults=False))


@pytest.mark.parametrize(("ranks", "steps"), [(2, 2000), (2, 200_000), (256, 200)], ids=["2x2000", "2x200000",
                                                                                          "256x200"])
def test_a_finished_dashboard_saved_with_widget_state_stays_small(ranks, steps):
    """benchmarks/saved_size.py measures a real run's saved notebook; this is the widget's own share of it, for
    any length of run and any width: the snapshot's points and the logs' tails are bounded."""
    run = RecordingRun("saved", world_size=ranks, workers=[
        {"rank": r, "node": f"10.0.0.{r % 4}", "pid": r, "device": "cpu", "state": "finished", "step": steps}
        for r in range(ranks)])
    run.rows = rows(ranks, steps)
    run.logs = [{"rank": r, "text": f"rank {r} says hello\n" * 2000} for r in range(ranks)]
    view = dashboard_of(run)
    run.summary.update(state="succeeded", ended=200.0)
    view.update()

    saved = saved_state(view.widget)
    print(f"\n{ranks} ranks x {steps} steps: the finished dashboard's saved state is {len(saved) / 1024:.0f} KB")
    assert len(saved) < SAVED_LIMIT
    assert sum(map(len, view.widget.log_snapshot.values())) <= LOG_SNAPSHOT_CHARS
    assert "Run saved: succeeded" in view.widget.final
