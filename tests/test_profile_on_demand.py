"""Profiling a live run on demand: ``run.profile(steps, ranks)`` runs torch.profiler for the next steps on the
chosen ranks, keeps each rank's trace in the run's directory and answers with the top operators by self time —
on the session's loopback cluster, real DDP (gloo), real torch.profiler.
"""

from __future__ import annotations

import gzip
import json
import os
import time

import pytest

import nbtrain
from nbtrain._exceptions import InvalidOptionError, NbtrainError

from _helpers import wait_for


def small_model_loop(config):
    """A two-layer model, an SGD step every 0.02 s, until stopped."""
    import torch

    model = nbtrain.prepare_model(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                      torch.nn.Linear(32, 1)))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for step in range(1, 1_000_000):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        nbtrain.report(step=step)
        time.sleep(config["step_time"])


def reports_only(config):
    """No optimizer given to nbtrain: the profile steps at each report. The rank's process dies once it has
    been profiled for 6 steps in all: during a second profile, which so never gets its answer."""
    import torch

    layer = torch.nn.Linear(16, 4)
    profiled = 0
    for step in range(1, 1_000_000):
        with torch.no_grad():
            layer(torch.randn(8, 16)).sum()
        nbtrain.report(step=step)
        profiled += torch.autograd._profiler_enabled()
        if profiled >= 6:
            os._exit(3)
        time.sleep(0.02)


def _running(run, step: int) -> bool:
    run.refresh()
    return len(run.workers) > 0 and all(w["state"] == "running" and (w.get("step") or 0) >= step
                                        for w in run.workers)


def _trace_events(path: str) -> list:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def test_a_profile_of_5_steps_has_the_models_operators_and_a_trace_per_rank(cluster):
    run = nbtrain.launch(small_model_loop, name="profile-live", workers=2, config={"step_time": 0.02})
    try:
        wait_for(lambda: _running(run, 3), timeout=120, message="both ranks stepping", describe=lambda: run.workers)
        profile = run.profile(steps=5, ranks=[0, 1], timeout=120)
        assert sorted(profile.tables) == [0, 1]
        for rank in (0, 1):
            names = [row["name"] for row in profile.tables[rank]]
            assert {"aten::addmm", "aten::linear", "aten::mm"} & set(names), names
            assert profile.answers[rank]["steps"] == 5
            path = profile.trace_paths[rank]
            assert path.endswith(f"profile-live/profiles/profile-1/rank{rank}.pt.trace.json.gz"), path
            assert os.path.getsize(path) > 0
            assert any(event.get("name", "").startswith("aten::") for event in _trace_events(path))
        page, text = profile._repr_html_(), str(profile)
        assert "<table>" in page and "aten::" in page and "ui.perfetto.dev" in page
        assert "rank 0: 5 steps on the CPU" in text and "tensorboard --logdir" in text
        assert run.changes == []  # a profile changes nothing

        # the dashboard's button: 10 steps of rank 0, the table under its control row
        from nbtrain._views.dashboard.dashboard import WidgetDashboard

        dashboard = WidgetDashboard(run)
        dashboard.update()
        dashboard.act({"action": "profile"})  # the message the page's Profile button sends
        wait_for(lambda: "aten::" in dashboard.widget.answer, timeout=120,
                 message="the profile's table under the dashboard's controls",
                 describe=lambda: (dashboard.widget.answer, dashboard.widget.notice))
        assert "rank 0: 10 steps on the CPU" in dashboard.widget.answer
        assert "profile-2/rank0.pt.trace.json.gz" in dashboard.widget.answer

        # bad input: one line each, nothing sent
        sent = len(run._call("control", 0, 0, 0.0)[1])
        with pytest.raises(InvalidOptionError, match=r"run.profile\(steps=...\) must be a whole number from 1 to "
                                                     r"1000, got 0"):
            run.profile(steps=0)
        with pytest.raises(InvalidOptionError, match=r"run.profile\(ranks=...\) is a list of the run's ranks, 0 to "
                                                     r"1; got \[5\]"):
            run.profile(steps=3, ranks=[5])
        assert len(run._call("control", 0, 0, 0.0)[1]) == sent
    finally:
        run.stop()
    with pytest.raises(NbtrainError, match=r"run.profile\(\): run 'profile-live' has ended \(stopped\); it has no "
                                           r"steps to profile"):
        run.profile(steps=5)


def test_a_loop_without_an_optimizer_is_profiled_at_its_reports(cluster):
    run = nbtrain.launch(reports_only, name="profile-reports", workers=1)
    try:
        wait_for(lambda: _running(run, 3), timeout=120, message="the rank reporting")
        profile = run.profile(steps=3, timeout=120)
        assert "aten::addmm" in {row["name"] for row in profile.tables[0]} or \
            "aten::linear" in {row["name"] for row in profile.tables[0]}
        assert profile.answers[0]["steps"] == 3

        # the run fails during a profile: said as such, with its error, not a reader's internal error
        with pytest.raises(NbtrainError, match=r"^Run 'profile-reports' ended \(failed\) before it answered; only "
                                               r"a live run can.\nRank 0's worker process died"):
            run.profile(steps=10, timeout=120)
    finally:
        run.stop()
