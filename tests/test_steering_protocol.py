"""The steering protocol's one declaration: commands and heartbeats as the notebook, the supervisor and the
ranks share them, and each adjustable setting checked once, with its own message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _steering_fakes import AgreedAsAsked

from nbtrain import InvalidOptionError
from nbtrain._cluster.command_kinds.kind import MIN_LEAD_STEPS
from nbtrain._cluster.command_kinds.table import describe
from nbtrain._cluster.commands import (
    ADJUST,
    AS_SOON_AS_BACK,
    CHECKPOINT,
    DECLINED,
    PAUSE,
    REWIND,
    SETTINGS,
    STOP_AFTER_EPOCH,
    Command,
    SteeringBeat,
    checked_settings,
)
from nbtrain._cluster.rank.rank_steering import RankSteering
from nbtrain._cluster.supervisor.run_steering import RunSteering

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
    assert describe(command) == "lr 0.1 → 0.01 at step 12"


def _supervisor_steering() -> RunSteering:
    return RunSteering(record=lambda kind, message, **_fields: None, persist=lambda: None)


def _rank_steering(rank: int) -> tuple[RankSteering, list[tuple]]:
    """A rank's steering with the session fields it reads (a stand-in for the rank's session, which needs a
    run); the list collects what it tells the supervisor it applied."""
    applied: list[tuple] = []
    supervisor = SimpleNamespace(command_applied=SimpleNamespace(remote=lambda *args: applied.append(args)))
    session = SimpleNamespace(supervisor=supervisor, context=SimpleNamespace(rank=rank), uses_loader=False,
                              report_calls=0, last_step=0, step=0, epoch=0, commands_due=lambda due: None,
                              timing=None, resumed_step=None)
    return RankSteering(session, [], AgreedAsAsked()), applied


def test_the_supervisor_proposes_a_step_ahead_of_the_furthest_rank_or_the_step_all_are_held_at():
    steering = _supervisor_steering()
    running = {0: SteeringBeat(step=40, rate=2.0, epoch=1, settings={"lr": [0.1]}),
               1: SteeringBeat(step=43, rate=1.0, epoch=1, settings={"lr": [0.1]})}
    assert steering.issue(ADJUST, {"lr": 0.05, "group": None}, running, live=True).at_step == 43 + MIN_LEAD_STEPS
    held = {rank: SteeringBeat(step=50, rate=0.0, epoch=1, settings={"lr": [0.1]}, paused_at=50) for rank in (0, 1)}
    assert steering.issue(PAUSE, {}, held, live=True).at_step == 50 + MIN_LEAD_STEPS  # no pause asked: stale word
    assert steering.issue(ADJUST, {"lr": 0.01, "group": None}, held, live=True).at_step == 50  # paused: held there
    steering.issue("resume", {}, held, live=True)
    # resumed, the ranks may be past step 50 before their heartbeats say so
    assert steering.issue(ADJUST, {"lr": 0.02, "group": None}, held, live=True).at_step == 50 + MIN_LEAD_STEPS
    assert steering.issue(PAUSE, {}, {}, live=False).at_step == AS_SOON_AS_BACK


def _two_rank_run(at: int = 20) -> tuple[RunSteering, Command]:
    """A run's steering in attempt 1 of two ranks, with one adjust proposed at step ``at``."""
    steering = _supervisor_steering()
    steering.new_attempt(1)
    running = {rank: SteeringBeat(step=at - MIN_LEAD_STEPS, rate=1.0, epoch=0, settings={"lr": [0.1]})
               for rank in (0, 1)}
    return steering, steering.issue(ADJUST, {"lr": 0.01, "group": None}, running, live=True)


def test_every_rank_that_learnt_a_command_in_time_applies_it_at_the_proposed_step():
    steering, adjust = _two_rank_run(at=20)
    steering.learnt(1, 0, [adjust.id], 18)
    steering.learnt(1, 1, [adjust.id], 19)
    assert steering.step_for(1, adjust.id, 0, 15, {0, 1}, {}) == 20  # asked early: not yet, at 20
    assert steering.step_for(1, adjust.id, 0, 20, {0, 1}, {}) == 20
    assert steering.step_for(1, adjust.id, 1, 20, {0, 1}, {}) == 20  # settled once, for all


def test_a_rank_that_learnt_a_command_late_moves_it_on_for_every_rank_rather_than_apply_it_alone():
    """Under load, one rank's question for commands was answered after it passed the proposed step (the CI run
    whose replicas differed at step 9): the command is settled at a later step, which both ranks reach."""
    steering, adjust = _two_rank_run(at=20)
    steering.learnt(1, 0, [adjust.id], 18)
    steering.learnt(1, 1, [adjust.id], 22)  # rank 1 can apply it from step 22 on
    running = {rank: SteeringBeat(step=21, rate=1.0, epoch=0) for rank in (0, 1)}
    later = steering.step_for(1, adjust.id, 0, 20, {0, 1}, running)
    assert later >= 22 and later == steering.all()[0].at_step
    assert steering.step_for(1, adjust.id, 1, 22, {0, 1}, running) == later  # rank 1, at its first step: wait for it
    assert steering.step_for(1, adjust.id, 0, later, {0, 1}, running) == later
    assert steering.step_for(1, adjust.id, 1, later, {0, 1}, running) == later


def test_a_rank_asking_past_the_proposed_step_settles_it_at_its_own_when_every_rank_can():
    steering, adjust = _two_rank_run(at=20)
    steering.learnt(1, 0, [adjust.id], 23)
    steering.learnt(1, 1, [adjust.id], 22)
    assert steering.step_for(1, adjust.id, 1, 23, {0, 1}, {}) == 23
    assert steering.step_for(1, adjust.id, 0, 23, {0, 1}, {}) == 23


def test_a_rank_that_says_nothing_moves_the_command_on_after_the_wait(monkeypatch):
    """Its question for commands may be answered later still: the command never lands without its word."""
    from nbtrain._cluster.supervisor import run_steering

    monkeypatch.setattr(run_steering, "AGREE_WAIT_S", 0.05)
    steering, adjust = _two_rank_run(at=20)
    running = {rank: SteeringBeat(step=20, rate=10.0, epoch=0) for rank in (0, 1)}
    later = steering.step_for(1, adjust.id, 0, 20, {0, 1}, running)
    assert later > 20 and steering.all()[0].at_step == later


def test_a_rank_that_declined_a_command_is_not_waited_for():
    """An exec reaches a rank whose loop has no step boundary: it answers why and will never run the code; the
    other rank runs it at its step, not 5 s later."""
    steering, adjust = _two_rank_run(at=20)
    steering.learnt(1, 1, [adjust.id], DECLINED)
    assert steering.step_for(1, adjust.id, 0, 20, {0, 1}, {}) == 20


def test_a_rank_whose_function_ended_is_not_waited_for():
    steering, adjust = _two_rank_run(at=20)
    steering.learnt(1, 0, [adjust.id], 18)  # rank 1 returned from its function before learning it
    assert steering.step_for(1, adjust.id, 0, 20, {0}, {}) == 20


def test_code_run_on_some_ranks_is_settled_with_those_ranks_only():
    """``run.exec`` reads DDP's replicas at one step on the ranks it asks, and waits for no other."""
    steering = _supervisor_steering()
    steering.new_attempt(1)
    running = {rank: SteeringBeat(step=17, rate=1.0, epoch=0, settings={"lr": [0.1]}) for rank in (0, 1, 2)}
    code = steering.issue("exec", {"source": "step", "ranks": [0, 2]}, running, live=True, attempt=1)
    steering.learnt(1, 0, [code.id], 18)
    steering.learnt(1, 2, [code.id], 21)  # rank 2 learnt it late: the read moves on for both
    later = steering.step_for(1, code.id, 0, code.at_step, {0, 1, 2}, running)
    assert later >= 21 and steering.step_for(1, code.id, 2, later, {0, 1, 2}, running) == later
    assert steering.step_for(1, code.id, 0, later, {0, 1, 2}, running) == later  # rank 1 was never asked


def test_an_earlier_attempts_rank_is_not_kept_waiting_for_a_step():
    steering, adjust = _two_rank_run(at=20)
    steering.new_attempt(2)
    steering.learnt(1, 1, [adjust.id], 25)  # ignored: attempt 1 is over
    assert steering.step_for(1, adjust.id, 0, 21, {0, 1}, {}) == 21


class InProcessAgreement:
    """The rank's side of settling steps wired straight to a real :class:`RunSteering` (attempt 1, ranks 0 and 1),
    as the supervisor's ``command_learnt`` and ``step_for`` hand them on."""

    def __init__(self, steering: RunSteering, rank: int) -> None:
        self.steering, self.rank = steering, rank

    def learnt(self, command_ids, first_step):
        self.steering.learnt(1, self.rank, command_ids, first_step)

    def step_for(self, command, step):
        return self.steering.step_for(1, command.id, self.rank, step, {0, 1}, {})


@pytest.mark.parametrize(("late_at", "landed_at"), [(None, 10), (11, 13)])
def test_two_ranks_apply_a_checkpoint_at_one_step_however_late_one_learns_it(monkeypatch, late_at, landed_at):
    """The CI run's failure, replayed in lockstep without Ray: rank 0 learns a command at step 5, rank 1 at step 5
    or only at step 11, after the proposed step 10. Both apply it at one step: 10, or one both can still reach."""
    from nbtrain._cluster.supervisor import run_steering

    monkeypatch.setattr(run_steering, "AGREE_WAIT_S", 0.05)  # rank 1's word, not coming: the test runs both
    supervisor = _supervisor_steering()
    supervisor.new_attempt(1)
    beats = {rank: SteeringBeat(step=7, rate=1.0, epoch=0) for rank in (0, 1)}
    issued = supervisor.issue(CHECKPOINT, {}, beats, live=True)
    assert issued.at_step == 10
    ranks = []
    for rank in (0, 1):
        steering, applied = _rank_steering(rank)
        steering.agreement = InProcessAgreement(supervisor, rank)
        ranks.append((steering, applied))
    for step in range(1, 20):
        for rank, (steering, _applied) in enumerate(ranks):
            session = steering.session
            session.last_step = session.report_calls = step - 1  # this report is the step's
            if step == (late_at if rank == 1 and late_at else 5):
                steering.learn([supervisor.all()[0]])  # as the supervisor has it then (since())
            if steering.pending:
                steering.at_report()
    steps = {rank: [(command_id, step) for command_id, _r, step, _b, _w in applied]
             for rank, (_s, applied) in enumerate(ranks)}
    assert steps == {0: [(issued.id, landed_at)], 1: [(issued.id, landed_at)]}
    assert supervisor.all()[0].at_step == landed_at


def test_a_rank_asks_for_a_learnt_commands_step_and_waits_for_the_one_settled():
    """The rank's side: it says from which step it can apply what it learnt, asks as the command falls due, and
    applies it where the supervisor settles it, not before."""

    class MovesOn(AgreedAsAsked):
        def step_for(self, command, step):
            super().step_for(command, step)
            return 7 if step < 7 else step

    agreement = MovesOn()
    steering, applied = _rank_steering(rank=0)
    steering.agreement = agreement
    model = torch.nn.Linear(2, 1)
    optimizer = steering.steer(torch.optim.SGD(model.parameters(), lr=0.1))
    steering.learn([Command(1, ADJUST, {"lr": 0.01, "group": None}, at_step=4, issued=1.0)])
    try:
        _train_steps(steering, model, optimizer, 7)
    finally:
        steering.unhook()
    assert agreement.said == [([1], 3)]  # learnt at step 1, maybe inside its hook: two steps on, to be sure
    assert agreement.asked == [(1, 4), (1, 7)]
    assert [(command_id, step) for command_id, _, step, _, _ in applied] == [(1, 7)]


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
    assert describe(Command(**{**stop.as_dict(), "applied_step": 6, "before": before})) == \
        "stop after epoch 1, learnt at step 6"


def _train_steps(steering: RankSteering, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        steering.session.last_step += 1
        steering.session.report_calls += 1


def test_a_new_attempt_follows_the_runs_changes_as_one_fact_and_no_rank_reports_them_again():
    """Issue 55 (9): a run adjusted at step 4, then restarted, said "command 1 was applied at different steps (rank
    0 at step 140, rank 1 at step 41)" on its new attempt. The new attempt's ranks re-apply the change without a
    word; the supervisor says once what the attempt follows; a rewind no rank reached is dropped, with why."""
    events: list[tuple[str, str]] = []
    run = RunSteering(record=lambda kind, message, **_fields: events.append((kind, message)), persist=lambda: None)
    beats = {rank: SteeringBeat(step=1, rate=0.0, epoch=0, settings={"lr": [0.1]}, restore_points=(1,))
             for rank in (0, 1)}
    change = run.issue(ADJUST, {"lr": 0.05, "group": None}, beats, live=True)
    for rank in (0, 1):
        run.applied(change.id, rank, change.at_step, {"lr": [0.1]}, 1.0, world_size=2)
    rewind = run.issue(REWIND, {"step": None, "skip": 0}, beats, live=True)  # the attempt dies before it lands
    run.new_attempt(2)
    assert run.all()[rewind.id - 1].dropped.startswith(f"attempt 1 ended before its ranks reached step "
                                                       f"{rewind.at_step}; attempt 2 resumes")
    assert ("rewind", f"the rewind to step 1 was not applied: {run.all()[rewind.id - 1].dropped}") in events
    assert ("change", f"attempt 2 follows the run's changes: lr 0.1 → 0.05 at step {change.at_step}") in events
    assert run.issue(REWIND, {"step": None, "skip": 0}, beats, live=True).id == 3, "the dropped one blocks no rewind"

    ranks = []
    for rank in (0, 1):  # attempt 2's ranks learn the run's commands from their payload
        steering, applied = _rank_steering(rank)
        steering.__init__(steering.session, run.all()[:2])
        model = torch.nn.Linear(2, 1)
        optimizer = steering.steer(torch.optim.SGD(model.parameters(), lr=0.1))
        try:
            _train_steps(steering, model, optimizer, change.at_step + 1)
        finally:
            steering.unhook()
        ranks.append((optimizer.param_groups[0]["lr"], applied))
    assert ranks == [(0.05, []), (0.05, [])], "a re-applied change was reported as landing again"
    assert not any("different steps" in message for _, message in events)


def test_a_change_the_loaded_checkpoint_holds_is_not_applied_over_its_schedule_again():
    """A new attempt that loads its optimizer's and scheduler's state from a checkpoint past a change goes on with
    the schedule's progress since: applying "lr → 0.05" again at its first step would undo the decay."""
    steering, applied = _rank_steering(rank=0)
    change = Command(1, ADJUST, {"lr": 0.05, "grad_clip": 2.0, "group": None}, at_step=3, issued=1.0, applied_step=3)
    steering.session.resumed_step = None
    steering.__init__(steering.session, [change])
    model = torch.nn.Linear(2, 1)
    optimizer = steering.steer(torch.optim.SGD(model.parameters(), lr=0.1))
    saved = torch.optim.SGD(model.parameters(), lr=0.05 * 0.9 ** 2).state_dict()  # the schedule's lr at step 8
    optimizer.load_state_dict(saved)
    steering.session.resumed_step = steering.session.last_step = 8  # what nbtrain.load_checkpoint() does
    try:
        _train_steps(steering, model, optimizer, 2)
    finally:
        steering.unhook()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 0.9 ** 2)
    assert steering.grad_clip == 2.0, "gradient clipping is no optimizer's state: it is applied"
    assert applied == []
