"""Where every rank is, now: ``run.stacks()`` on a live run, and the stacks a stall takes on its own — on the
session's loopback cluster, real DDP ranks (gloo).

Rank 0 blocks in ``dist.all_reduce`` (rank 1 never joins it) while rank 1 sleeps in a loop of user code:
the stacks must name both lines, and say which rank waits in a collective.
"""

from __future__ import annotations

import inspect

import pytest
from _steering_fakes import AgreedAsAsked

import nbtrain
from nbtrain._client.run.inspection_results import Stacks
from nbtrain._exceptions import InvalidOptionError, NbtrainError
from nbtrain._views.dashboard.dashboard import WidgetDashboard

from _helpers import wait_for


def blocked_and_sleeping(config):
    """Rank 0 waits in an all-reduce that rank 1 never joins; rank 1 sleeps in a loop."""
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 0 waits here
    while True:
        time.sleep(0.2)  # rank 1 sleeps here


def _line(marker: str) -> int:
    lines, first = inspect.getsourcelines(blocked_and_sleeping)
    return first + next(index for index, line in enumerate(lines) if marker in line)


def _where(run) -> Stacks | None:
    stacks = run.stacks(timeout=10)
    kinds = {rank: answer["kind"] for rank, answer in stacks.ranks.items()}
    return stacks if kinds == {0: "collective", 1: "elsewhere"} else None


def test_stacks_say_which_rank_waits_in_a_collective_and_where_the_other_is(cluster):
    run = nbtrain.launch(blocked_and_sleeping, name="stacks-live", workers=2, stall_timeout_s=4.0)
    try:
        wait_for(lambda: {w["state"] for w in run.workers} >= {"running"} and len(run.workers) == 2, timeout=120,
                 message="both ranks running", describe=lambda: run.workers)
        stacks = wait_for(lambda: _where(run), timeout=60, message="rank 0 in all_reduce, rank 1 asleep")
        all_reduce, sleep = _line("rank 0 waits here"), _line("rank 1 sleeps here")
        lines = stacks.verdicts()
        assert lines[0].startswith("rank 0 waits in a collective (all_reduce) called from "
                                   f"test_live_stacks.py:{all_reduce} in blocked_and_sleeping"), lines[0]
        assert "dist.all_reduce(torch.ones(1))" in lines[0]
        assert lines[1].startswith(f"rank 1 is elsewhere: test_live_stacks.py:{sleep} in blocked_and_sleeping "
                                   "(time.sleep(0.2)"), lines[1]
        # every thread, nbtrain's own marked as such; the training thread first
        for rank in (0, 1):
            threads = stacks.ranks[rank]["threads"]
            assert threads[0]["whose"] == "training"
            assert {"nbtrain-flush", "nbtrain-steering"} <= {t["name"] for t in threads if t["whose"] == "nbtrain"}
        text, page = str(stacks), stacks._repr_html_()
        assert f'test_live_stacks.py", line {all_reduce}, in blocked_and_sleeping' in text
        assert "waits in a collective (all_reduce)" in page and "<details open>" in page
        assert run.changes == []  # looking changes nothing

        # the stall (4 s without progress) takes the stacks on its own, in an event after the stall's
        said = wait_for(lambda: [e["message"] for e in run.events if e["message"].startswith("Stacks at the stall:")],
                        timeout=60, message="the stall's stacks event", describe=lambda: run.events[-3:])
        assert f"rank 0 waits in a collective (all_reduce) called from test_live_stacks.py:{all_reduce}" in said[0]
        assert f"rank 1 is elsewhere: test_live_stacks.py:{sleep}" in said[0]
        assert [e["kind"] for e in run.events if e["message"] == said[0]] == ["stacks"]
        dashboard = WidgetDashboard(run)
        dashboard.update()
        assert "Stacks at the stall: rank 0 waits in a collective" in dashboard.widget.notice["text"]

        # the dashboard's Stacks button (the message its page sends) shows the same, under its control row
        dashboard.act({"action": "stacks"})
        wait_for(lambda: "rank 1 is elsewhere" in dashboard.widget.answer, timeout=30,
                 message="the stacks under the dashboard's controls")
        assert "rank 0 waits in a collective (all_reduce)" in dashboard.widget.answer

        # bad input: one line each, nothing sent (the stall's watcher may send stacks of its own meanwhile)
        sent = [c for c in run._call("control", 0, 0, 0.0)[1] if c.args.get("ranks") != [0, 1]]
        with pytest.raises(InvalidOptionError, match=r"run.stacks\(ranks=...\) is a list of the run's ranks, 0 to 1; "
                                                     r"got \[5\]"):
            run.stacks(ranks=[5])
        with pytest.raises(InvalidOptionError, match=r"run.stacks\(timeout=...\)"):
            run.stacks(timeout=0)
        assert [c for c in run._call("control", 0, 0, 0.0)[1] if c.args.get("ranks") != [0, 1]] == sent
    finally:
        run.stop()
    with pytest.raises(NbtrainError, match=r"run.stacks\(\): run 'stacks-live' has ended \(stopped\); it has no "
                                           r"stacks to take"):
        run.stacks()


@pytest.mark.quick
def test_a_rank_that_does_not_answer_is_named():
    """A rank's answer that does not come within the timeout: named, with what that may mean (a unit of the
    notebook's side: the answers as the supervisor gives them)."""
    stacks = Stacks("r", [0, 1], {0: (True, {"kind": "elsewhere", "verdict": "is elsewhere: a.py:1 in f",
                                             "threads": [], "pid": 1})}, 10)
    assert stacks.verdicts()[1] == ("rank 1 did not answer within 10 s (its process is gone, or stuck in C code "
                                    "that holds Python's GIL)")
    assert list(stacks.missing) == [1]


@pytest.mark.quick
def test_a_backward_waiting_on_ddps_all_reduce_counts_as_a_collective():
    """DDP's gradient all-reduce has no Python frame of its own: a backward whose last bucket is handed over and
    not yet reduced (the step clock's hook says so) is a collective; a backward still computing is not."""
    import os
    import traceback

    import torch

    from nbtrain._cluster.rank.inspection.thread_stacks import verdict

    autograd = os.path.join(os.path.dirname(torch.__file__), "autograd", "__init__.py")
    frames = [traceback.FrameSummary("/home/me/train.py", 12, "train", line="loss.backward()"),
              traceback.FrameSummary(os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), 600, "backward"),
              traceback.FrameSummary(autograd, 300, "backward")]
    assert verdict(frames, allreduce_in_flight=True) == (
        "collective", "waits in a collective (DDP's gradient all_reduce in backward) called from train.py:12 in "
                      "train (loss.backward())")
    kind, line = verdict(frames)
    assert kind == "elsewhere" and line.startswith("is elsewhere: train.py:12 in train (loss.backward()); innermost")
    assert verdict(frames, paused_at=7)[0] == "paused"


class _Recorder:
    """Stands in for the supervisor's handle: keeps what a rank sends with ``.remote``."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def __getattr__(self, method: str):
        recorder = self

        class _Method:
            @staticmethod
            def remote(*args):
                recorder.sent.append((method, *args))
        return _Method


@pytest.mark.quick
def test_stacks_are_answered_as_soon_as_learnt_and_an_earlier_attempts_are_not():
    """A ``stacks`` command is answered on the listener's thread as it is learnt, never waits in the hooks' pending
    list; a new attempt does not answer (or profile) again what an earlier attempt was asked."""
    from types import SimpleNamespace

    from nbtrain._cluster.commands import Command
    from nbtrain._cluster.rank.rank_steering import RankSteering

    supervisor = _Recorder()
    session = SimpleNamespace(supervisor=supervisor, context=SimpleNamespace(rank=1, attempt=2, device="cpu"),
                              timing=None, uses_loader=False, report_calls=0, last_step=0, step=0,
                              commands_due=lambda due: None)
    earlier = [Command(1, "adjust", {"lr": 0.1}, at_step=3, issued=0.0, applied_step=3),
               Command(2, "stacks", {"ranks": [0, 1]}, at_step=5, issued=0.0),
               Command(3, "profile", {"steps": 5, "ranks": [1]}, at_step=6, issued=0.0)]
    steering = RankSteering(session, earlier, AgreedAsAsked())
    steering.learn(earlier)  # the listener's first answer: every command after the last change
    assert supervisor.sent == [] and [c.id for c in steering.pending] == [1]

    steering.learn([Command(4, "stacks", {"ranks": [1]}, at_step=9, issued=0.0),
                    Command(5, "stacks", {"ranks": [0]}, at_step=9, issued=0.0)])
    [(method, command_id, rank, ok, answer)] = supervisor.sent
    assert (method, command_id, rank, ok) == ("command_result", 4, 1, True)
    # the training thread is this one (it made the steering), here in this test: its line is the call above
    assert answer["kind"] == "elsewhere" and "test_live_stacks.py" in answer["verdict"], answer["verdict"]
    assert answer["threads"][0]["whose"] == "training"
    assert [c.id for c in steering.pending] == [1]
