"""A rank's learning rate has one owner, ``optimizer_settings.rescale_lr``, whoever changes it: an elastic run's
scale (``prepare_optimizer``), the adaptive batch's gain, ``adjust(lr=)`` and a rewind's ``lr_factor``. Each
change is a factor that the LR schedulers' base values follow, so a schedule computed from its base goes on
from the changed rate. (The adaptive batch used to set ``group["lr"]`` alone: the next ``LambdaLR`` or
``OneCycleLR`` step dropped its gain.) Real torch optimizers and schedulers, no cluster."""

from __future__ import annotations

import types

import pytest
import torch

from nbtrain._cluster.elastic.adaptive_batch import Choice
from nbtrain._cluster.rank import optimizer_settings
from nbtrain._cluster.rank.data import loading
from nbtrain._cluster.rank.payload import local_payload
from nbtrain._cluster.rank.session import TrainingSession, set_session

pytestmark = pytest.mark.quick

SCHEDULES = {
    "LambdaLR": lambda opt, lr: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step)),
    "OneCycleLR": lambda opt, lr: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=40),
    "StepLR": lambda opt, lr: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
    "CosineAnnealingLR": lambda opt, lr: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20),
    "CyclicLR": lambda opt, lr: torch.optim.lr_scheduler.CyclicLR(opt, base_lr=lr / 10, max_lr=lr, step_size_up=4),
}


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=0.9)


def _step(optimizer: torch.optim.Optimizer, scheduler) -> float:
    optimizer.step()
    scheduler.step()
    return optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_a_rate_scaled_mid_schedule_goes_on_as_if_the_schedule_had_started_from_it(kind):
    """Every schedule here is proportional to its rate: scaled by 3 at step 5, it is from then on the schedule
    of a twin started at 3 times the rate."""
    scaled, twin = _optimizer(0.1), _optimizer(0.3)
    schedule, twin_schedule = SCHEDULES[kind](scaled, 0.1), SCHEDULES[kind](twin, 0.3)
    for _ in range(5):
        _step(scaled, schedule), _step(twin, twin_schedule)
    optimizer_settings.rescale_lr(scaled, 3.0)
    assert scaled.param_groups[0]["lr"] == pytest.approx(twin.param_groups[0]["lr"])
    assert schedule.get_last_lr() == pytest.approx(twin_schedule.get_last_lr())
    for step in range(6, 16):
        assert _step(scaled, schedule) == pytest.approx(_step(twin, twin_schedule)), f"{kind} at step {step}"


def test_adjust_then_a_rewinds_factor_compose_and_the_schedule_follows_both():
    optimizer = _optimizer(0.1)
    schedule = SCHEDULES["LambdaLR"](optimizer, 0.1)
    _step(optimizer, schedule)  # lr 0.1 / 2
    optimizer_settings.set_value(optimizer, optimizer.param_groups[0], "lr", 0.2)  # adjust(lr=0.2)
    assert optimizer.param_groups[0]["lr"] == 0.2  # the value asked for, exactly
    optimizer_settings.rescale_lr(optimizer, 0.5)  # rewind(lr_factor=0.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert _step(optimizer, schedule) == pytest.approx(0.1 * 2 / 3)  # base 0.2 (0.1 x 4 x 0.5) / (1 + 2)


def test_one_group_is_changed_alone():
    optimizer = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.1},
                                 {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.01}])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    optimizer_settings.set_value(optimizer, optimizer.param_groups[1], "lr", 0.05)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.1, 0.05])
    assert _step(optimizer, schedule) == pytest.approx(0.1)
    assert schedule.get_last_lr() == pytest.approx([0.1, 0.05])


@pytest.fixture
def rank_session(request):
    """A rank's session with no run around it; ``lr_scale`` (an elastic run's scale for this attempt's world
    size) from the test's parameter, else 1."""
    scale = getattr(request, "param", 1.0)
    session = TrainingSession(local_payload("lr-owner", lr_scale=scale), torch.device("cpu"))
    set_session(session)
    try:
        yield session
    finally:
        set_session(None)


@pytest.mark.parametrize("rank_session", [2.0], indirect=True)
def test_an_elastic_runs_scale_reaches_a_scheduler_made_before_prepare_optimizer(rank_session):
    import nbtrain

    optimizer = _optimizer(0.1)
    schedule = SCHEDULES["LambdaLR"](optimizer, 0.1)  # made first: its base is the unscaled 0.1
    prepared = nbtrain.prepare_optimizer(optimizer)
    assert prepared.param_groups[0]["lr"] == pytest.approx(0.2)
    assert _step(optimizer, schedule) == pytest.approx(0.2 / 2)  # not 0.1 / 2: the scale kept
    nbtrain.prepare_optimizer(optimizer)  # prepared again: scaled once
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2 / 2)


class _Noise:
    """The gradient noise estimate as the adaptive batch reads it: known, and large against the batch."""

    true_sq = types.SimpleNamespace(value=1.0)
    trace = types.SimpleNamespace(value=1000.0)


def _adapt_with_gain(session, gain: float, monkeypatch) -> None:
    """``PreparedLoader._adapt`` with one rank (its all-reduce a no-op) and the batch rule's choice fixed."""
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor: None)
    monkeypatch.setattr(loading.adaptive_batch, "choose", lambda *args: Choice(batch_size=8, lr_gain=gain))
    loader = loading.PreparedLoader(lambda size: list(range(size or 8)), 8, move_to_device=False)
    loader._initial, loader._timed = 8, [1.0, 10]
    loader._adapt(session)


def _adaptive_session(optimizer: torch.optim.Optimizer):
    return types.SimpleNamespace(noise=_Noise(), adaptive_batch=(8, 64), optimizers=[optimizer], lr_gain=1.0,
                                 context=types.SimpleNamespace(device=torch.device("cpu"), world_size=1))


@pytest.mark.parametrize("kind", ["LambdaLR", "OneCycleLR", "StepLR"])
def test_the_adaptive_batchs_gain_is_kept_by_the_schedule_at_its_next_step(kind, rank_session, monkeypatch):
    """The adaptive batch's gain, chosen at step 5, reaches the learning rate, and the schedule goes on as a
    twin started at 4 times the rate (the adaptive batch used to set ``group["lr"]`` alone, which ``LambdaLR``
    and ``OneCycleLR`` dropped at their next step)."""
    optimizer, twin = _optimizer(0.1), _optimizer(0.4)
    schedule, twin_schedule = SCHEDULES[kind](optimizer, 0.1), SCHEDULES[kind](twin, 0.4)
    for _ in range(5):
        _step(optimizer, schedule), _step(twin, twin_schedule)
    session = _adaptive_session(optimizer)
    _adapt_with_gain(session, 4.0, monkeypatch)
    assert session.lr_gain == 4.0
    assert optimizer.param_groups[0]["lr"] == pytest.approx(twin.param_groups[0]["lr"])
    for step in range(6, 16):
        assert _step(optimizer, schedule) == pytest.approx(_step(twin, twin_schedule)), \
            f"{kind} dropped the adaptive batch's gain at step {step}"


@pytest.mark.parametrize("rank_session", [2.0], indirect=True)
def test_the_rate_a_rank_reports_is_the_product_the_docs_say(rank_session, monkeypatch):
    """docs/elastic.md: the code's rate times the elastic scale, the adaptive batch's gain, then ``adjust(lr=)``
    (the value itself) and a rewind's ``lr_factor``, in the order they came; ``LambdaLR`` on top of each."""
    import nbtrain

    optimizer = nbtrain.prepare_optimizer(_optimizer(0.1))  # elastic scale 2: 0.2
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 2)
    _adapt_with_gain(_adaptive_session(optimizer), 3.0, monkeypatch)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 2 * 3)
    assert _step(optimizer, schedule) == pytest.approx(0.1 * 2 * 3 / 2)
    optimizer_settings.set_value(optimizer, optimizer.param_groups[0], "lr", 0.05)  # adjust(lr=0.05)
    assert optimizer.param_groups[0]["lr"] == 0.05
    optimizer_settings.rescale_lr(optimizer, 0.5)  # rewind(lr_factor=0.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    assert _step(optimizer, schedule) == pytest.approx(0.025 * 2 / 3), "the schedule's base lost a factor"
