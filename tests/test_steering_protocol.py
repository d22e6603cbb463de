"""The steering protocol's one declaration: commands and heartbeats as the notebook, the supervisor and the
ranks share them, and each adjustable setting checked once, with its own message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nbtrain import InvalidOptionError
from nbtrain._cluster.commands import (
    ADJUST,
    AS_SOON_AS_BACK,
    PAUSE,
    SETTINGS,
    STOP_AFTER_EPOCH,
    Command,
    SteeringBeat,
    checked_settings,
)
from nbtrain._cluster.rank.steering import RankSteering
from nbtrain._cluster.run.steering import MIN_LEAD_STEPS, RunSteering

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(("name", "bad", "said"), [
    ("lr", -0.1, "adjust(lr=...) must be a finite number >= 0, got -0.1."),
    ("weight_decay", float("inf"), "adjust(weight_decay=...) must be a finite number >= 0, got inf."),
    ("momentum", True, "adjust(momentum=...) must be a finite number >= 0, got True."),
    ("betas", (0.9, 1.0), "adjust(betas=...) must be a pair like (0.9, 0.999), each in [0, 1), got (0.9, 1.0)."),
    ("grad_clip", 0, "adjust(grad_clip=...) must be a finite number > 0, or None to stop clipping, got 0."),
])
def test_each_setting_is_refused_by_its_one_message(name, bad, said):
    assert name in SETTINGS
    with pytest.raises(InvalidOptionError) as refused:
        checked_settings({name: bad}, "adjust({name}=...)")
    assert str(refused.value) == said


def test_good_settings_come_back_as_the_ranks_apply_them():
    assert checked_settings({"lr": 1, "betas": (0.5, 0.99), "grad_clip": None}, "{name}") == \
        {"lr": 1.0, "betas": [0.5, 0.99], "grad_clip": None}


def test_a_saved_command_reads_back_the_same():
    command = Command(3, ADJUST, {"lr": 0.01, "group": None}, at_step=12, issued=1.0, applied_step=12,
                      before={"lr": [0.1]})
    assert Command(**command.as_dict()) == command
    assert command.settings == {"lr": 0.01} and command.group is None
    assert command.describe() == "lr 0.1 → 0.01 at step 12"


def _supervisor_steering() -> RunSteering:
    return RunSteering(record=lambda kind, message: None, persist=lambda: None)


def _rank_steering(rank: int) -> tuple[RankSteering, list[tuple]]:
    """A rank's steering with the session fields it reads (a stand-in for the rank's session, which needs a
    run); the list collects what it tells the supervisor it applied."""
    applied: list[tuple] = []
    supervisor = SimpleNamespace(command_applied=SimpleNamespace(remote=lambda *args: applied.append(args)))
    session = SimpleNamespace(supervisor=supervisor, context=SimpleNamespace(rank=rank), uses_loader=False,
                              report_calls=0, last_step=0, step=0, epoch=0, commands_due=lambda due: None,
                              timing=None)
    return RankSteering(session, []), applied


def test_the_supervisor_picks_a_step_ahead_of_the_furthest_rank_or_the_step_all_are_held_at():
    steering = _supervisor_steering()
    running = {0: SteeringBeat(step=40, rate=2.0, epoch=1, settings={"lr": [0.1]}),
               1: SteeringBeat(step=43, rate=1.0, epoch=1, settings={"lr": [0.1]})}
    assert steering.issue(ADJUST, {"lr": 0.05, "group": None}, running, live=True).at_step == 43 + MIN_LEAD_STEPS
    held = {rank: SteeringBeat(step=50, rate=0.0, epoch=1, paused_at=50) for rank in (0, 1)}
    assert steering.issue(PAUSE, {}, held, live=True).at_step == 50
    assert steering.issue("resume", {}, {}, live=False).at_step == AS_SOON_AS_BACK


def test_the_supervisor_refuses_what_the_ranks_said_they_cannot_do():
    steering = _supervisor_steering()
    sgd = {0: SteeringBeat(step=5, rate=1.0, epoch=0, settings={"lr": [0.1], "momentum": [0.0]})}
    with pytest.raises(ValueError, match="its optimizer has no betas; it has lr, momentum"):
        steering.issue(ADJUST, {"betas": [0.9, 0.99], "group": None}, sgd, live=True)
    with pytest.raises(ValueError, match="gives nbtrain no optimizer"):
        steering.issue(ADJUST, {"lr": 0.1, "group": None}, {0: SteeringBeat(step=5, rate=1.0, epoch=0)}, live=True)
    with pytest.raises(ValueError, match="count no epochs"):
        steering.issue(STOP_AFTER_EPOCH, {}, sgd, live=True)
    assert steering.commands == []


def test_a_rank_applies_a_command_at_its_step_on_a_real_optimizer():
    """The supervisor's Command, as the rank learns it: lr, betas and grad_clip land before that step's update."""
    steering, applied = _rank_steering(rank=0)
    model = torch.nn.Linear(2, 1)
    optimizer = steering.steer(torch.optim.Adam(model.parameters(), lr=0.1))
    issued = _supervisor_steering().issue(ADJUST, {**checked_settings(
        {"lr": 0.01, "betas": (0.8, 0.9), "grad_clip": 1.0}, "{name}"), "group": None},
        {0: steering.beat()}, live=True)
    steering.learn([issued])
    try:
        for _ in range(issued.at_step):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
    finally:
        steering.unhook()  # steer() registered torch's global step hooks, as a rank's session does
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], steering.grad_clip) == (0.01, (0.8, 0.9), 1.0)
    [(command_id, rank, step, before, _)] = applied
    assert (command_id, rank, step, before["lr"]) == (1, 0, issued.at_step, [0.1])
    said = steering.beat()
    assert said.settings == {"lr": [0.01], "weight_decay": [0.0], "betas": [[0.8, 0.9]], "grad_clip": [1.0]}


def test_a_stop_after_the_epoch_takes_hold_at_its_step_so_every_rank_ends_the_same_epoch():
    """Learnt early by one rank and late by another, a stop must not end the epoch on one only: DDP's next
    collective would then wait for a rank that has gone. So it takes hold at its step, in that step's epoch."""
    steering, applied = _rank_steering(rank=1)
    session = steering.session
    model = torch.nn.Linear(2, 1)
    optimizer = steering.steer(torch.optim.SGD(model.parameters(), lr=0.1))
    stop = Command(1, STOP_AFTER_EPOCH, {"epoch": 0}, at_step=6, issued=1.0)
    steering.learn([stop])
    try:
        for update in range(1, 7):
            if update == 5:
                assert not steering.stop_requested(), "epoch 0 ended before the stop's step"
                session.epoch = 1  # the next epoch starts before the step the stop is due at
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
    finally:
        steering.unhook()
    assert steering.stop_requested() and steering.stop_after_epoch == 1
    [(command_id, rank, step, before, _)] = applied
    assert (command_id, rank, step, before) == (1, 1, 6, {"epoch": 1})
    assert Command(**{**stop.as_dict(), "applied_step": 6, "before": before}).describe() == \
        "stop after epoch 1, learnt at step 6"
