"""Steering a live run from the notebook: a change applied at the same step on every rank, pause and resume,
checkpoint now, a user command, stop after the epoch — on the session's loopback cluster, real DDP (gloo).

Each rank reports, every step, its learning rate and the sum of its model's parameters: DDP keeps the
replicas identical only if every rank applies a change before the same step's update, which those
sums show.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import nbtrain
from nbtrain._cluster.command_kinds.table import register
from nbtrain._exceptions import NbtrainError

from _helpers import wait_for
from _tagging_kind import Tag


def steered_loop(config):
    """Epochs of 20 batches (prepare_loader), one SGD step each, 0.05 s a step; until stopped."""
    import torch

    torch.manual_seed(0)
    model = nbtrain.prepare_model(torch.nn.Linear(4, 1))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    data = torch.utils.data.TensorDataset(torch.randn(160, 4), torch.randn(160, 1))
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(data, batch_size=4))

    @nbtrain.on_command("where")
    def where(extra=0):
        return {"rank": nbtrain.get_context().rank, "extra": extra}

    for _epoch in range(10_000):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            if nbtrain.checkpoint_requested():
                nbtrain.save_checkpoint({"model": model.state_dict()})
            total = float(sum(p.detach().sum() for p in model.parameters()))
            nbtrain.report(lr=optimizer.param_groups[0]["lr"], params=total)
            time.sleep(config["step_time"])


def _rows_by_step(run):
    by_step: dict[int, dict[int, dict]] = {}
    for row in run.metrics:
        by_step.setdefault(row["step"], {})[row["rank"]] = row
    return by_step


def _reached(run, step: int) -> bool:
    run.refresh()
    workers = run.workers  # read once: a restarting attempt empties the table between two reads
    return min((w.get("step") or 0) for w in workers) >= step if workers else False


def test_a_live_run_is_steered_on_every_rank_at_the_same_step(cluster):
    run = nbtrain.launch(steered_loop, name="steering-live", workers=2, config={"step_time": 0.05},
                         stall_timeout_s=2.0)
    try:
        wait_for(lambda: _reached(run, 5), timeout=120, message="the run to take 5 steps")

        applied = run.adjust(lr=0.01, momentum=0.0, wait=True)
        wait_for(lambda: _reached(run, applied + 2), timeout=60, message="steps past the change")
        rows = _rows_by_step(run)
        for step, ranks in rows.items():
            if len(ranks) == 2 and step < applied + 2:
                assert ranks[0]["params"] == ranks[1]["params"], f"replicas differ at step {step}"
                assert ranks[0]["lr"] == ranks[1]["lr"] == (0.1 if step < applied else 0.01), step
        [change] = run.changes
        assert change["step"] == applied and change["before"]["lr"] == [0.1]
        assert change["description"] == f"lr 0.1 → 0.01, momentum 0.5 → 0 at step {applied}"
        assert run.config_at(applied - 1)["lr"] == 0.1 and run.config_at(applied)["lr"] == 0.01
        assert any(e["kind"] == "change" and e["message"] == change["description"] for e in run.events)

        assert run.send("where", extra=3) == {"rank": 0, "extra": 3}
        assert run.send("where", ranks="all") == [{"rank": 0, "extra": 0}, {"rank": 1, "extra": 0}]
        with pytest.raises(NbtrainError, match="Rank 0 has no handler for 'nowhere'"):
            run.send("nowhere", timeout=20)

        tag = register(Tag())  # a kind of command nbtrain does not know: notebook -> supervisor -> ranks
        with pytest.raises(nbtrain.InvalidOptionError, match=r"tag\(text=...\) is a string, not 3"):
            run._reader.channel.steer("tag", {"text": 3}, "tagged")
        tagged = run._reader.channel.steer(tag.name, {"text": "here"}, "tagged")
        wait_for(lambda: any(c["kind"] == "tag" and c["step"] is not None for c in run.changes), timeout=60,
                 message="the ranks to apply the tag")
        [change] = [c for c in run.changes if c["kind"] == "tag"]
        assert change["step"] >= tagged.at_step and change["before"] == {"lr": [0.01]}
        assert change["description"] == f"tag 'here' at step {change['step']}"
        for rank in (0, 1):  # what it printed comes with the rank's next push of its logs
            wait_for(lambda rank=rank: f"tagged 'here' at step {change['step']}" in run.logs(rank), timeout=30,
                     message=f"rank {rank}'s line of the tag, at rank 0's step")

        asked = run.checkpoint_now(wait=True)
        wait_for(lambda: (run.summary().get("checkpoint") or {}).get("step", -1) >= asked, timeout=60,
                 message="the checkpoint asked for")

        stalls = [e for e in run.events if e["kind"] == "stall"]  # a loaded machine may stall a rank before
        paused_at = run.pause(wait=True)
        wait_for(lambda: run.summary()["paused_at"] == paused_at and
                 {w["state"] for w in run.workers} == {"paused"}, timeout=30, message="both ranks paused")
        time.sleep(3.0)  # the pause must outlast stall_timeout_s (2 s): a duration under test, not a wait for state
        assert {w["step"] for w in run.workers} == {paused_at}  # the table says the header's step
        with pytest.raises(NbtrainError, match="paused already \\(or about to be\\)"):
            run.pause()
        run.resume()
        wait_for(lambda: _reached(run, paused_at + 3), timeout=60, message="the run to go on after resume()")
        assert [e for e in run.events if e["kind"] == "stall"] == stalls, "the pause was taken for a stall"
        for rank in (0, 1):  # no step lost or repeated across the pause
            steps = [row["step"] for row in run.metrics if row["rank"] == rank]
            assert steps == list(range(1, len(steps) + 1)), rank

        run.stop(after="epoch")
        assert run.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.STOPPED
        last = max(row["step"] for row in run.metrics)
        assert last % 20 == 0, f"stopped at step {last}, not at an epoch's end"
        assert "as run.stop(after='epoch') asked" in " ".join(e["message"] for e in run.events)
        with pytest.raises(NbtrainError, match="it has ended \\(stopped\\)"):
            run.adjust(lr=1.0)
        with pytest.raises(nbtrain.InvalidOptionError, match="adjust\\(\\) cannot change learning_rate"):
            run.adjust(learning_rate=1.0)
        with pytest.raises(nbtrain.InvalidOptionError, match=r"adjust\(lr=...\) must be a finite number >= 0, got nan"):
            run.adjust(lr=float("nan"))
    finally:
        if not run.state.is_terminal:
            run.stop()


def returns_after_a_requested_stop(config):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = nbtrain.prepare_loader(DataLoader(TensorDataset(torch.arange(40.0)), batch_size=2))  # 10 steps/epoch
    for epoch in range(1000):
        for (x,) in loader:
            nbtrain.report(x=float(x.sum()))
            time.sleep(0.02)
        if nbtrain.stop_requested():
            return {"epochs": epoch + 1, "rank": nbtrain.get_context().rank}
    return None


def test_a_function_that_returns_after_a_requested_stop_gives_its_result(cluster):
    run = nbtrain.launch(returns_after_a_requested_stop, name="steering-stop-returns", workers=2)
    try:
        wait_for(lambda: _reached(run, 3), timeout=120, message="the run to take steps")
        run.stop(after="epoch")
        assert run.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.STOPPED
    finally:
        if not run.state.is_terminal:
            run.stop()
    assert run.result is not None, "the function returned after the stop, and its result was dropped"
    epochs = run.result[0]["epochs"]
    assert run.result == [{"epochs": epochs, "rank": 0}, {"epochs": epochs, "rank": 1}]
    assert max(row["step"] for row in run.metrics) == epochs * 10, "it stopped at the end of the epoch it was in"
    assert any("as run.stop(after='epoch') asked; the training function returned its result" in e["message"]
               for e in run.events), run.events


def no_optimizer_given(config):
    """Updates its weights itself: no torch optimizer steps (one that steps is steered without a call, see
    test_their_code_on_ranks)."""
    import torch

    weight = torch.zeros(2)
    for step in range(2000):
        weight -= 0.1 * torch.ones(2)
        nbtrain.report(step=step + 1)
        time.sleep(0.05)


def test_adjusting_a_run_that_gives_no_optimizer_says_what_to_call(cluster):
    run = nbtrain.launch(no_optimizer_given, name="steering-no-optimizer", workers=1)
    try:
        wait_for(lambda: _reached(run, 3), timeout=120, message="the run to take steps")
        with pytest.raises(NbtrainError, match=r"gives nbtrain no optimizer to adjust\. Call "
                                               r"nbtrain\.prepare_optimizer\(optimizer\)"):
            run.adjust(lr=0.01)
        with pytest.raises(NbtrainError, match="count no epochs"):
            run.stop(after="epoch")
        # paused at its report: the worker table says the step the header does (it said the one before)
        paused_at = run.pause(wait=True)
        wait_for(lambda: {w["state"] for w in run.workers} == {"paused"}, timeout=30, message="the rank paused")
        assert run.summary()["paused_at"] == paused_at and [w["step"] for w in run.workers] == [paused_at]
    finally:
        run.stop()


def fails_once_after_the_change(config):
    """The first attempt steps until its learning rate was changed, and 3 steps more; then rank 1 is killed.
    The second runs 200 steps from the start, at full speed."""
    import torch

    model = nbtrain.prepare_model(torch.nn.Linear(2, 1))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    first = nbtrain.get_context().attempt == 1  # attempts count from 1
    changed_at = None
    for step in range(1, 2001 if first else 201):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        lr = optimizer.param_groups[0]["lr"]
        nbtrain.report(step=step, lr=lr, asked=float(nbtrain.checkpoint_requested()))
        if first:
            changed_at = changed_at or (step if lr != 0.1 else None)
            if changed_at and step == changed_at + 3 and nbtrain.get_context().rank == 1:
                import os
                import signal

                os.kill(os.getpid(), signal.SIGKILL)  # the rank's process dies, as on a lost node
            time.sleep(0.1)


def test_a_restarted_attempt_applies_the_changes_at_the_same_steps(cluster):
    run = nbtrain.launch(fails_once_after_the_change, name="steering-restart", workers=2, max_failures=1)
    wait_for(lambda: _reached(run, 3), timeout=120, message="the first attempt to take steps")
    applied = run.adjust(lr=0.05, wait=True)
    run.checkpoint_now()  # the first attempt's to heed (its code never saves): not the second's
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    second = [row for row in run.metrics if row["attempt"] == 2]
    assert len(second) == 400
    assert {row["asked"] for row in second} == {0.0}, "an earlier attempt's checkpoint request came back"
    assert {row["lr"] for row in second if row["step"] < applied} == {0.1}
    assert {row["lr"] for row in second if row["step"] >= applied} == {0.05}


def test_the_dashboards_controls_steer_the_run_and_mark_the_curves(cluster):
    from nbtrain._views.dashboard.dashboard import WidgetDashboard

    run = nbtrain.launch(steered_loop, name="steering-dashboard", workers=2, config={"step_time": 0.05})
    try:
        wait_for(lambda: _reached(run, 5), timeout=120, message="the run to take 5 steps")
        dashboard = WidgetDashboard(run)
        dashboard.update()
        widget = dashboard.widget

        def field(key: str) -> str | None:  # the value the page's field for `key` shows; None: not shown
            return next((f["value"] for f in widget.controls["fields"] if f["key"] == key), None)

        assert field("lr") == "0.1" and field("momentum") == "0.5" and field("betas") is None

        dashboard.act({"action": "adjust", "key": "lr", "value": "0.02"})  # as the page sends a typed value
        assert widget.controls["pending"] == {"lr": "0.02"} and field("lr") == "0.1", "shown as asked, not as done"
        wait_for(lambda: [c for c in run.changes if c["step"] is not None], timeout=30, message="the change applied")
        wait_for(lambda: (dashboard.update(), field("lr") == "0.02")[1], timeout=30,
                 message="the run to report lr 0.02 on its ranks")
        assert "lr" not in widget.controls["pending"]
        assert [mark.label for mark in dashboard.marks()] == ["lr 0.1 → 0.02"]

        dashboard.act({"action": "pause"})
        wait_for(lambda: run.summary()["paused_at"] is not None, timeout=30, message="the run paused")
        dashboard.update()
        assert f"paused at step {run.summary()['paused_at']}" in widget.header
        assert widget.controls["paused"], "the page's button says Resume"
        dashboard.act({"action": "resume"})
        wait_for(lambda: run.summary()["paused_at"] is None, timeout=30, message="the run resumed")

        dashboard.act({"action": "adjust", "key": "lr", "value": "fast"})
        assert widget.notice["text"] == "lr: 'fast' is not a number; nothing was changed."

        # guards and rewind: the row says the guards in force; Rewind waits for a restore point, refuses a bad step
        assert widget.controls["guards"] == ""
        run.guard(nan="pause", spike=4.0)
        wait_for(lambda: run.summary().get("guard"), timeout=30, message="the guard set")
        dashboard.update()
        assert "guards: non-finite loss or gradients → pause; loss > 4x its running median → rewind" \
            in widget.controls["guards"]
        if not run.summary().get("restore_points"):
            rewind = widget.controls["rewind"]
            assert not rewind["enabled"] and rewind["placeholder"] == "no restore point yet"
        dashboard.act({"action": "rewind", "step": "soon", "skip": "0"})  # a click before the next redraw
        assert widget.notice["text"].startswith("Rewind: the step must be a whole number")

        left: list[str] = []  # what the saved notebook keeps once the run ends: its static picture
        dashboard._static_handle = SimpleNamespace(update=lambda shown: left.append(shown.data))
        run.stop()
        run.wait(timeout=60)
        dashboard.update()
        assert len(left) == 1 and ">lr 0.1 → 0.02</text>" in left[0]
    finally:
        run.stop()


def counts_from_its_checkpoint(config):
    """Starts at the checkpoint's step (0 without one), reports `scale * step` for 30 steps, checkpointing each 10."""
    import torch

    found = nbtrain.load_checkpoint()
    start = int(found["step"]) if found else 0
    for step in range(start + 1, start + 31):
        nbtrain.report(step=step, value=config["scale"] * step)
        if step % 10 == 0:
            nbtrain.save_checkpoint({"step": torch.tensor(step)})
        time.sleep(config.get("step_time", 0.0))


def test_a_fork_starts_at_its_parents_checkpoint_and_compares_with_it(cluster):
    from nbtrain._views.compare import compare

    parent = nbtrain.launch(counts_from_its_checkpoint, name="steering-parent", workers=1, config={"scale": 1.0})
    assert parent.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    with pytest.raises(NbtrainError, match=r"keeps no checkpoint at or before step 5 \(it keeps the last 2: "
                                           r"steps 20, 30\)"):
        parent.fork(step=5)
    with pytest.warns(UserWarning, match=r"scale, step_time reach the ranks as config values only"):
        child = parent.fork(step=25, config={"scale": 2.0, "step_time": 0.1}, name="steering-child")
    wait_for(lambda: child.refresh() is not None and child.metrics, timeout=120, message="the fork's first row")
    first = min(row["step"] for row in child.metrics)
    assert first == 21, "the fork starts after its parent's checkpoint at step 20 (the latest at or before 25)"
    assert child.summary()["parent"] == {"run": "steering-parent", "step": 20}
    said = "forked from steering-parent at step 20 with scale=2.0, step_time=0.1"
    assert said in [e["message"] for e in child.events]

    comparison = compare([parent, "steering-child"], metric="value")  # one live, one ended
    curves = comparison.curves()
    assert curves["steering-parent"][0][:2] == [1.0, 2.0] and curves["steering-child"][0][0] == 21.0
    table = {row["run"]: row for row in comparison.table()}
    assert table["steering-child"]["forked from"] == "steering-parent @ 20"
    assert (table["steering-parent"]["scale"], table["steering-child"]["scale"]) == (1.0, 2.0)
    assert table["steering-parent"]["final value"] == 30.0
    assert child.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    assert compare(["steering-child"], metric="value").table()[0]["final value"] == 100.0
    with pytest.raises(nbtrain.RunNotFoundError, match="no-such-run"):
        compare(["steering-parent", "no-such-run"])


def restores_its_optimizer(config):
    """SGD at config["lr"], saved with the model each 10 steps and restored from the checkpoint: a fork gets the
    parent's lr back from the optimizer's state, whatever its config says. Reports the lr it trains at."""
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9))
    found = nbtrain.load_checkpoint()
    start = 0
    if found:
        model.load_state_dict(found["model"])
        optimizer.load_state_dict(found["optimizer"])
        start = int(found["step"])
    for step in range(start + 1, start + 21):
        optimizer.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        group = optimizer.param_groups[0]
        nbtrain.report(step=step, lr=group["lr"], momentum=group["momentum"])
        if step % 10 == 0:
            nbtrain.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                     "step": torch.tensor(step)})


def test_a_fork_trains_at_its_config_from_its_first_step_though_its_code_restores_the_optimizer(cluster):
    parent = nbtrain.launch(restores_its_optimizer, name="steering-opt-parent", workers=2, config={"lr": 0.05})
    assert parent.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    child = parent.fork(config={"lr": 0.2, "momentum": 0.5}, name="steering-opt-child")
    assert child.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    rows = [row for row in child.metrics if "lr" in row]
    assert min(row["step"] for row in rows) == 21 and len(rows) == 2 * 20
    assert {(row["lr"], row["momentum"]) for row in rows} == {(0.2, 0.5)}, "a step trained at the parent's lr"
    assert child.config["lr"] == 0.2
    change = child.changes[0]
    assert change["step"] == 21 and change["args"]["lr"] == 0.2 and change["before"]["lr"] == [0.05], child.changes
    assert "lr 0.05 → 0.2" in change["description"], change  # the history shows the change
    with pytest.raises(nbtrain.InvalidOptionError, match=r"run.fork\(config=\{'lr': ...\}\) must be a finite "
                                                         r"number >= 0, got -1"):
        parent.fork(config={"lr": -1}, name="steering-opt-bad")
