"""Rewinds and guards without a cluster: one rank's restore point restored on a real model, optimizer and LR
schedule; the guard's checks on a real optimizer's gradients; the supervisor's choice of the step to rewind to and
its one decision per trip; each bad input refused by one line (tests/test_rewind.py runs them on real ranks)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from _steering_fakes import AgreedAsAsked

from nbtrain import InvalidOptionError, NbtrainError
from nbtrain._client.run import control as client_control
from nbtrain._client.run.control import RunControl
from nbtrain._client.run.rewinds import RunRewinds
from nbtrain._cluster.commands import ADJUST, GUARD, PAUSE, REWIND, Command, SteeringBeat
from nbtrain._cluster.rank.guarding import RankGuard
from nbtrain._cluster.rank.rank_steering import RankSteering
from nbtrain._cluster.rank.reporting import Reporter
from nbtrain._cluster.supervisor.run_steering import RunSteering
from nbtrain._guards import checked_guard, describe_guard
from nbtrain._options import RunOptions

pytestmark = pytest.mark.quick


def _rank() -> tuple[RankSteering, SimpleNamespace]:
    applied: list[tuple] = []
    supervisor = SimpleNamespace(command_applied=SimpleNamespace(remote=lambda *args: applied.append(args)))
    session = SimpleNamespace(supervisor=supervisor, context=SimpleNamespace(rank=0), uses_loader=False,
                              reporter=Reporter(), report_calls=0, last_step=0, step=0, epoch=0,
                              commands_due=lambda due: None, timing=None, applied=applied, resumed_step=None)
    session.current_step = lambda: session.reporter.last_step
    return RankSteering(session, [], AgreedAsAsked()), session


def test_a_restore_point_puts_model_optimizer_schedule_and_rng_back_in_place():
    steering, session = _rank()
    model = torch.nn.Linear(3, 1)
    optimizer = steering.steer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    steering.points.models.append(model)
    session.uses_loader = True  # a prepared loader's place is kept (none here: the loop's own counts)

    def step(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).pow(2).sum().backward()
            optimizer.step()
            schedule.step()
            session.reporter.report({"loss": 1.0})

    try:
        step(3)
        steering.saved_checkpoint()
        kept = ({k: v.clone() for k, v in model.state_dict().items()}, optimizer.param_groups[0]["lr"],
                schedule.last_epoch, torch.get_rng_state())
        weight = model.weight
        momentum = optimizer.state[model.weight]["momentum_buffer"].clone()
        for _ in range(2):  # twice to the same point: the first branch must not have changed it
            step(4)
            assert not torch.equal(model.weight, kept[0]["weight"])
            steering.points.restore(3, skip=0)
            assert torch.equal(optimizer.state[model.weight]["momentum_buffer"], momentum)
    finally:
        steering.unhook()
    assert model.weight is weight, "the model's parameters were replaced, not restored in place"
    assert torch.equal(model.weight, kept[0]["weight"]) and torch.equal(model.bias, kept[0]["bias"])
    assert (optimizer.param_groups[0]["lr"], schedule.last_epoch) == kept[1:3]
    assert torch.equal(torch.get_rng_state(), kept[3])
    assert session.reporter.last_step == 3
    assert all(p.grad is None for p in model.parameters()), "the next update would apply the branch's gradients"


def test_a_loop_nbtrain_cannot_restore_says_what_to_add():
    steering, _session = _rank()
    assert steering.points.refusal() == (
        "rank 0 has no optimizer given to nbtrain and no loader prepared by nbtrain, so nbtrain cannot restore the "
        "model's and optimizer's state (give the optimizer: nbtrain.prepare_optimizer(optimizer) or nbtrain.steerable) "
        "nor the loop's position in its data (give the loader: for batch in nbtrain.prepare_loader(loader)). Either "
        "way works: use those, or register @nbtrain.on_rewind def back_to(checkpoint, step, skip_batches): ... in the "
        "training function to restore it yourself.")
    assert steering.beat().rewind_refusal == steering.points.refusal()
    # an @on_rewind function restores what nbtrain cannot, but a rewind still needs a step to happen at
    from nbtrain._cluster.rank import rewinding

    rewinding.on_rewind(lambda checkpoint, step, skip_batches: None)
    try:
        assert steering.points.refusal() == (
            "rank 0's loop gives nbtrain neither its optimizer (nbtrain.prepare_optimizer or nbtrain.steerable) nor "
            "its loader (nbtrain.prepare_loader), so a rewind has no step to happen at: give it one of them.")
        steering.steer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
        assert steering.points.refusal() is None
    finally:
        steering.unhook()
        rewinding.forget_hooks()


def test_a_loop_with_an_optimizer_and_no_loader_is_told_only_its_position_is_missing():
    """A loop that uses no loader at all (tensors made in the loop): not "a loader of its own"."""
    steering, _session = _rank()
    steering.steer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    try:
        assert steering.points.refusal() == (
            "rank 0 has 1 optimizer given to nbtrain and no loader prepared by nbtrain, so nbtrain cannot restore the "
            "loop's position in its data (give the loader: for batch in nbtrain.prepare_loader(loader)). Either way "
            "works: use those, or register @nbtrain.on_rewind def back_to(checkpoint, step, skip_batches): ... in the "
            "training function to restore it yourself.")
    finally:
        steering.unhook()


def test_the_guard_trips_once_on_a_nan_loss_a_spike_and_non_finite_gradients():
    trips: list[tuple] = []
    guard = RankGuard(checked_guard({"nan": "rewind", "spike": 3.0}), lambda *trip: trips.append(trip))
    for step in range(1, 21):
        guard.saw_report({"loss": 1.0 + 0.01 * step}, step)
    guard.saw_report({"loss": 10.0}, 21)
    assert trips and trips[0][:2] == (21, "spike") and "above 3x its running median" in trips[0][2]
    guard.saw_report({"loss": float("nan")}, 22)
    assert len(trips) == 1, "a guard trips once per branch"
    guard.rearm(forget=True)
    guard.saw_report({"loss": float("nan")}, 23)
    assert trips[1] == (23, "nan", "its loss was nan at step 23")

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([[float("inf"), 1.0]])).sum().backward()
    guard.rearm()
    assert guard.gradients_finite(optimizer, 24) is False
    assert trips[2][:2] == (24, "nan")


def _beats(points: tuple[int, ...], step: int = 65, refusal: str | None = None) -> dict[int, SteeringBeat]:
    return {rank: SteeringBeat(step=step, rate=10.0, epoch=0, restore_points=points, rewind_refusal=refusal)
            for rank in (0, 1)}


def test_the_supervisor_rewinds_to_the_latest_point_every_rank_has_or_says_why_not():
    events: list[tuple[str, str]] = []
    steering = RunSteering(record=lambda kind, message, **_fields: events.append((kind, message)), persist=lambda: None)
    running = {0: SteeringBeat(step=65, rate=10.0, epoch=0, restore_points=(20, 40, 60)),
               1: SteeringBeat(step=65, rate=10.0, epoch=0, restore_points=(40, 60))}
    with pytest.raises(ValueError, match="no checkpoint at or before step 30 to rewind to; its ranks can go back to "
                                         "step 40, 60"):
        steering.issue(REWIND, {"step": 30, "skip": 0}, running, live=True)
    with pytest.raises(ValueError, match="rank 1's loop gives nbtrain no optimizer"):
        steering.issue(REWIND, {"step": None, "skip": 0}, _beats((40,), refusal="rank 1's loop gives nbtrain no "
                                                                               "optimizer"), live=True)
    command = steering.issue(REWIND, {"step": 55, "skip": 3}, running, live=True)
    assert command.rewind == (40, 3) and command.at_step > 65
    with pytest.raises(ValueError, match="a rewind to step 40 is under way"):
        steering.issue(REWIND, {"step": None, "skip": 0}, running, live=True)
    for rank in (1, 0):
        steering.applied(command.id, rank, command.at_step, None, 100.0 + rank, world_size=2)
    [rewind] = steering.rewinds()
    assert rewind.rank_times == {0: 100.0, 1: 101.0} and rewind.applied_step == command.at_step
    assert events[-1] == ("rewind", f"rewound to step 40, 3 batches skipped from step {command.at_step}")


def test_a_trip_gets_one_action_and_pauses_once_max_rewinds_are_spent():
    events: list[tuple[str, str]] = []
    steering = RunSteering(record=lambda kind, message, **_fields: events.append((kind, message)), persist=lambda: None)
    steering.issue(GUARD, checked_guard({"nan": "rewind", "lr_factor": 0.5, "max_rewinds": 1}), {}, live=True)
    running = _beats((20, 40))
    assert steering.guards.tripped(1, 0, 60, "nan", "rank 0: its loss was nan at step 60", running, live=True) is False
    assert steering.guards.tripped(1, 0, 60, "nan", "rank 1: its loss was nan at step 60", running, live=True) is False
    [rewind] = steering.rewinds()
    assert rewind.rewind == (40, 20) and rewind.args["lr_factor"] == 0.5
    assert rewind.args["why"] == "guard: nan at step 60"
    assert [kind for kind, _ in events] == ["guard", "guard"], "the second rank's trip was acted on again"
    for rank in (0, 1):
        steering.applied(rewind.id, rank, rewind.at_step, None, 5.0, world_size=2)
    assert steering.guards.tripped(1, 0, 90, "nan", "rank 0: stale", running, live=True) is False
    assert len(events) == 3, "a trip from the branch the rewind left was acted on"
    steering.guards.tripped(1, 1, 90, "nan", "rank 0: its loss was nan at step 90", running, live=True)
    assert steering.commands[-1].kind == PAUSE
    assert events[-1][1].endswith("its 1 rewinds (max_rewinds) are spent, so the run is paused: look at it, then "
                                  "run.rewind(...) and run.resume()")


@pytest.mark.parametrize(("given", "said"), [
    ({"nans": "rewind"}, "run.guard: unknown guard setting 'nans'; the settings are nan, spike, spike_action, "
                         "lr_factor, skip_batches, max_rewinds, metric."),
    ({"nan": "rewind", "lr_factor": 0}, "run.guard: lr_factor must be a finite number > 0 that the learning rate is "
                                        "multiplied by at a guard's rewind, or None, got 0."),
    ({"spike": -1.0}, "run.guard: spike must be a finite number above 1 (a loss above that times its running median "
                      "trips), or None, got -1.0."),
    ({"nan": "rewind", "skip_batches": -2}, "run.guard: skip_batches must be a whole number >= 0 of batches "
                                            "skipped after the restore point, or None (through the batch that "
                                            "tripped), got -2."),
    ({"nan": "explode"}, "run.guard: nan must be one of 'rewind', 'pause', 'stop', or None (no check), got 'explode'."),
])
def test_each_bad_guard_is_refused_by_one_line(given, said):
    with pytest.raises(InvalidOptionError) as refused:
        checked_guard(given)
    assert str(refused.value) == said


def test_the_launch_option_and_the_magics_flag_take_the_same_guard():
    from IPython.core.magic_arguments import parse_argstring

    from nbtrain._views.magic_flags import options_from_args
    from nbtrain._views.magics import NbtrainMagics

    assert RunOptions(guard={"nan": "rewind"}).guard == checked_guard({"nan": "rewind"})
    args = parse_argstring(NbtrainMagics.ray_train, "--guard nan=rewind spike=3 lr_factor=0.5")
    assert options_from_args(args, {}).guard == checked_guard({"nan": "rewind", "spike": 3, "lr_factor": 0.5})
    with pytest.raises(InvalidOptionError, match=r"guard \(--guard\): max_rewinds must be a whole number"):
        RunOptions(guard={"nan": "pause", "max_rewinds": -1})
    assert describe_guard(checked_guard({"nan": "rewind", "spike": 3})) == (
        "guards: non-finite loss or gradients → rewind; loss > 3x its running median → rewind (at most 3 rewinds)")


def test_a_state_past_the_budget_is_not_copied_and_the_refusal_says_what_to_do(monkeypatch):
    from nbtrain._cluster.rank import rewinding

    monkeypatch.setattr(rewinding, "BUDGET_MB", 0.001)
    steering, session = _rank()
    model = torch.nn.Linear(64, 64)
    try:
        steering.steer(torch.optim.SGD(model.parameters(), lr=0.1))
        steering.points.models.append(model)
        session.uses_loader = True
        steering.saved_checkpoint()
    finally:
        steering.unhook()
    [point] = steering.points.points
    assert point.models == [] and point.optimizers == []
    assert steering.points.refusal().startswith("rank 0's model and optimizer state (0 MB) is more than a restore "
                                                "point copies (NBTRAIN_REWIND_BUDGET_MB, 0 MB): register "
                                                "@nbtrain.on_rewind")


class _LiveRun:
    """The notebook's side of a live run as ``run.rewind(wait=True)`` reads it: the command as the supervisor
    holds it, and the run's summary, each as the test sets it."""

    def __init__(self, **summary: object) -> None:
        self.command = Command(1, REWIND, {"to_step": 40, "skip": 0}, at_step=47, issued=1.0)
        self.summary = {"state": "running", "paused_at": None, "step": 45, **summary}
        self.name = "live"

    def steer(self, kind: str, args: dict, verb: str) -> Command:
        return self.command

    def call(self, method: str, *args: object, timeout: float) -> Command:
        assert method == "command_applied_yet"
        return self.command

    def fetch_summary(self) -> dict:
        return dict(self.summary)


def _rewinds(run: _LiveRun) -> RunRewinds:
    return RunRewinds(SimpleNamespace(channel=run, fetch_summary=run.fetch_summary))  # type: ignore[arg-type]


@pytest.mark.parametrize(("live", "said"), [
    (dict(paused_at=46), "Run 'live' is paused at step 46: the rewind to step 40 applies between two whole steps, so "
                         "it lands as the run goes on (run.resume()); it is still due, nothing was cancelled."),
    (dict(state="failed"), "Run 'live' ended (failed) before rank 0 reached step 47, where the rewind to step 40 "
                           "was due."),
])
def test_a_rewind_waited_for_says_at_once_why_it_has_not_landed(live, said):
    """Issue 55 (9): ``run.rewind(wait=True)`` gave up after 30 s with "(is it paused, or between attempts?)"."""
    with pytest.raises(NbtrainError) as refused:
        _rewinds(_LiveRun(**live)).rewind(wait=True)
    assert str(refused.value) == said


def test_a_rewind_dropped_by_a_restart_says_so_and_one_that_landed_returns(monkeypatch):
    run = _LiveRun()
    run.command = Command(1, REWIND, {"to_step": 40, "skip": 0}, at_step=47, issued=1.0,
                          dropped="attempt 1 ended before its ranks reached step 47; attempt 2 resumes from the run's "
                                  "latest checkpoint. Ask again once it runs.")
    with pytest.raises(NbtrainError, match=r"the rewind to step 40 was not applied: attempt 1 ended before"):
        _rewinds(run).rewind(wait=True)
    run.command = Command(1, REWIND, {"to_step": 40, "skip": 0}, at_step=47, issued=1.0, applied_step=47)
    assert _rewinds(run).rewind(wait=True) == 40
    monkeypatch.setattr(client_control, "APPLIED_WAIT_S", 0.0)
    run.command = Command(1, REWIND, {"to_step": 40, "skip": 0}, at_step=47, issued=1.0)
    with pytest.raises(NbtrainError, match=r"rank 0 did not reach step 47, where the rewind to step 40 is due, within "
                                           r"0 s \(its ranks are at step 45: slow steps\?\); it is still due"):
        _rewinds(run).rewind(wait=True)


@pytest.mark.parametrize(("live", "said"), [
    (dict(paused_at=46), "Run 'live' is paused at step 46: adjust(lr=0.01) applies between two whole steps, so it "
                         "lands as the run goes on (run.resume()); it is still due, nothing was cancelled."),
    (dict(state="stopped"), "Run 'live' ended (stopped) before rank 0 reached step 47, where adjust(lr=0.01) was "
                            "due."),
])
def test_an_adjust_waited_for_says_why_it_has_not_landed_as_a_rewind_does(live, said):
    """``adjust(wait=True)`` waits in the same loop as ``rewind(wait=True)``: it used to give up after 30 s with
    "(is it paused, or between attempts?)" where the run's summary already said which."""
    run = _LiveRun(**live)
    run.command = Command(1, ADJUST, {"lr": 0.01, "group": None}, at_step=47, issued=1.0)
    control = RunControl(SimpleNamespace(channel=run, fetch_summary=run.fetch_summary))  # type: ignore[arg-type]
    with pytest.raises(NbtrainError) as refused:
        control.adjust(lr=0.01, wait=True)
    assert str(refused.value) == said


def test_a_pause_waited_for_returns_once_rank_0_applied_it_though_other_ranks_paused_first():
    """At 64 ranks (``benchmarks/scale.py``) the summary said "paused at step 79" before rank 0's own word on the
    pause came in, and ``pause(wait=True)`` raised that the run was paused: the pause it was waiting for."""
    run = _LiveRun(paused_at=79)
    waiting = Command(1, PAUSE, {}, at_step=79, issued=1.0)
    answers = iter([waiting, dataclasses.replace(waiting, applied_step=79)])
    run.call = lambda method, *args, timeout: next(answers)  # type: ignore[method-assign]
    control = RunControl(SimpleNamespace(channel=run, fetch_summary=run.fetch_summary))  # type: ignore[arg-type]
    run.command = waiting
    assert control.pause(wait=True) == 79
