"""A live run as a kernel, decided where it is decided: the notebook's checks of ``exec``/``patch`` sources, the
supervisor's refusal of a second exec, and a rank running code and patches in its training code's namespace at a
step boundary of a real optimizer (the rank's steering with a stand-in session, as in test_steering_protocol)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _steering_fakes import AgreedAsAsked

from nbtrain import InvalidOptionError
from nbtrain._cluster.command_kinds.table import command_kind, describe
from nbtrain._cluster.commands import EXEC, PATCH, SteeringBeat
from nbtrain._cluster.rank.rank_steering import RankSteering
from nbtrain._cluster.supervisor.run_steering import RunSteering

pytestmark = pytest.mark.quick


def scale(x: float) -> float:
    """The training code's own function, looked up by name in the loop below (so a patch reaches it)."""
    return x


def test_a_source_that_is_not_python_or_defines_nothing_is_refused_in_the_notebook():
    with pytest.raises(InvalidOptionError, match=r"run.exec\(source\) is not valid Python: .* \(line 1: 1 \+\)"):
        command_kind(EXEC).check({"source": "1 +"})
    with pytest.raises(InvalidOptionError, match=r"run.patch\(source\) defines nothing"):
        command_kind(PATCH).check({"source": "print(1)"})
    checked = command_kind(PATCH).check({"source": "def scale(x):\n    return 2 * x\nLOG_EVERY = 5\n"})
    assert checked["names"] == ["scale", "LOG_EVERY"] and checked["new"] is False


def _supervisor(events: list) -> RunSteering:
    return RunSteering(record=lambda kind, message, **_fields: events.append((kind, message)), persist=lambda: None)


def test_a_second_exec_is_refused_while_a_rank_of_the_first_has_not_answered():
    steering = _supervisor([])
    running = {rank: SteeringBeat(step=10, rate=1.0, epoch=0) for rank in (0, 1)}
    first = steering.issue(EXEC, {"source": "1", "ranks": None}, running, live=True, attempt=1)
    assert first.ranks == [0, 1]
    steering.result(first.id, 0, True, {"value": 1, "output": ""})
    with pytest.raises(ValueError, match=r"exec 1 is still running on rank\(s\) \[1\]"):
        steering.issue(EXEC, {"source": "2", "ranks": [0]}, running, live=True, attempt=1)
    assert steering.issue(EXEC, {"source": "2", "ranks": [0]}, running, live=True, attempt=2).ranks == [0]
    with pytest.raises(ValueError, match=r"rank\(s\) \[5\] are not running"):
        steering.issue(EXEC, {"source": "3", "ranks": [5]}, running, live=True, attempt=2)


def _rank(rank: int = 0) -> tuple[RankSteering, list[tuple], list[tuple]]:
    applied: list[tuple] = []
    answers: list[tuple] = []
    supervisor = SimpleNamespace(command_applied=SimpleNamespace(remote=lambda *args: applied.append(args)),
                                 command_result=SimpleNamespace(remote=lambda *args: answers.append(args)))
    session = SimpleNamespace(supervisor=supervisor, context=SimpleNamespace(rank=rank), uses_loader=False,
                              report_calls=0, last_step=0, step=0, epoch=0, commands_due=lambda due: None,
                              timing=None, resumed_step=None)
    return RankSteering(session, [], AgreedAsAsked()), applied, answers


def _train(steering: RankSteering, steps: int) -> list[float]:
    """The training code: its loop looks ``scale`` up each step, as a patch needs."""
    model = torch.nn.Linear(2, 1)
    optimizer = steering.steer(torch.optim.SGD(model.parameters(), lr=0.1))
    seen = []
    try:
        for step in range(1, steps + 1):
            seen.append(scale(1.0))
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            del step
    finally:
        steering.unhook()
    return seen


def test_exec_runs_in_the_training_codes_namespace_at_its_step_and_answers_value_and_output():
    steering, applied, answers = _rank()
    supervisor = _supervisor([])
    source = "print('at', step)\nfloat(model.weight.detach().sum()) == float(model.weight.detach().sum())"
    issued = supervisor.issue(EXEC, {"source": source, "ranks": None}, {0: SteeringBeat(step=1, rate=0.0, epoch=0)},
                              live=True, attempt=1)
    steering.optimizers.append(object())  # a steered optimizer: this rank has a step boundary
    steering.learn([issued])
    steering.optimizers.clear()
    _train(steering, issued.at_step + 1)
    [(command_id, rank, ok, value)] = answers
    assert (command_id, rank, ok) == (1, 0, True)
    # the boundary before step at_step: after the update of the loop's step at_step - 1
    assert value == {"value": True, "output": f"at {issued.at_step - 1}\n"}
    assert [said[:3] for said in applied] == [(1, 0, issued.at_step)]
    assert describe(issued) == f"exec \"print('at', step)…\" on rank(s) [0] at step {issued.at_step}"  # one line shown


def test_an_exception_in_exec_comes_back_with_its_own_line_and_training_goes_on():
    steering, _applied, answers = _rank(rank=1)
    supervisor = _supervisor([])
    issued = supervisor.issue(EXEC, {"source": "x = 1\n1 / 0", "ranks": None},
                              {1: SteeringBeat(step=1, rate=0.0, epoch=0)}, live=True, attempt=1)
    steering.optimizers.append(object())
    steering.learn([issued])
    steering.optimizers.clear()
    assert len(_train(steering, issued.at_step + 2)) == issued.at_step + 2
    [(_id, rank, ok, said)] = answers
    assert (rank, ok) == (1, False)
    assert said.startswith("Rank 1:\nTraceback") and 'File "<run.exec 1>", line 2' in said
    assert said.rstrip().endswith("ZeroDivisionError: division by zero") and "rank_steering" not in said


def test_a_rank_without_a_step_boundary_says_so_at_once():
    steering, _applied, answers = _rank()
    issued = _supervisor([]).issue(EXEC, {"source": "1", "ranks": None}, {0: SteeringBeat(step=1, rate=0.0, epoch=0)},
                                   live=True, attempt=1)
    steering.learn([issued])
    [(_id, _rank_said, ok, said)] = answers
    assert not ok and said.startswith("Rank 0 has no step boundary to run code at") and steering.pending == []


def test_a_patch_rebinds_the_training_codes_global_at_its_step_and_a_missing_name_rebinds_nothing():
    global scale
    original = scale
    events: list = []
    supervisor = _supervisor(events)
    running = {0: SteeringBeat(step=1, rate=0.0, epoch=0)}
    try:
        steering, applied, answers = _rank()
        missing = supervisor.issue(PATCH, command_kind(PATCH).check({"source": "def scael(x):\n    return 3 * x\n"}),
                                   running, live=True, attempt=1)
        steering.learn([missing])
        _train(steering, missing.at_step + 1)
        [(_id, _rank_said, ok, said)] = answers
        assert not ok and said["refused"].startswith("its training code has no scael; it has ")
        assert "scale" in said["refused"] and "new=True adds a name" in said["refused"]
        supervisor.result(missing.id, 0, ok, said)
        assert supervisor.changes() == [] and scale is original

        steering, applied, answers = _rank()
        patched = supervisor.issue(PATCH, command_kind(PATCH).check({"source": "def scale(x):\n    return 2 * x\n"}),
                                   running, live=True, attempt=1)
        steering.learn([patched])
        seen = _train(steering, patched.at_step + 3)
        assert seen == [1.0] * (patched.at_step - 1) + [2.0] * 4  # from its step on
        [(_id, _rank_said, ok, step)] = answers
        assert ok and step == patched.at_step
        [(command_id, _r, applied_step, _before, when)] = applied
        supervisor.applied(command_id, 0, applied_step, None, when, world_size=1)
        assert [c["description"] for c in supervisor.changes()] == [f"patched scale at step {patched.at_step}"]
        assert ("change", f"patched scale at step {patched.at_step}") in events
    finally:
        scale = original


def test_a_patch_and_an_exec_are_marked_on_the_dashboards_curves_where_they_applied():
    from nbtrain._client.run.run_history import Mark, marks_of

    changes = [{"applied_step": 7, "kind": PATCH, "args": {}, "description": "patched scale at step 7"},
               {"applied_step": 9, "kind": EXEC, "args": {}, "description": "exec 'x' on rank(s) [0] at step 9"},
               {"applied_step": 9, "kind": "stop_after_epoch", "args": {}, "description": "stop after epoch 1"}]
    assert marks_of({"changes": changes}, [], {}) == [Mark(7, PATCH, "patched scale"),
                                                       Mark(9, EXEC, "exec 'x' on rank(s) [0]")]


def test_a_rewind_keeps_a_patch_and_a_new_attempt_follows_it():
    events: list = []
    supervisor = _supervisor(events)
    running = {0: SteeringBeat(step=45, rate=0.0, epoch=0, restore_points=(40,))}
    patch = supervisor.issue(PATCH, command_kind(PATCH).check({"source": "def scale(x):\n    return 2 * x\n"}),
                             running, live=True, attempt=1)
    supervisor.applied(patch.id, 0, 50, None, 1.0, world_size=1)
    rewind = supervisor.issue("rewind", {"step": 45}, running, live=True, attempt=1)
    supervisor.applied(rewind.id, 0, 52, None, 2.0, world_size=1)
    assert not supervisor.all()[patch.id - 1].superseded  # in place, the code stays patched
    supervisor.new_attempt(2)
    assert ("change", "attempt 2 follows the run's changes: patched scale at step 50") in events


def test_a_fork_starts_with_its_parents_applied_patches_from_its_first_step_boundary():
    from nbtrain._client.run.forking import _patches

    parent = SimpleNamespace(changes=[
        {"kind": PATCH, "step": 12, "args": {"source": "LOG_EVERY = 5\n"}},
        {"kind": PATCH, "step": None, "args": {"source": "never = 1\n"}},  # not applied: not inherited
        {"kind": "adjust", "step": 3, "args": {"lr": 0.1}}])
    assert _patches(parent) == ("LOG_EVERY = 5\n",)
    supervisor = _supervisor([])
    supervisor.start_with_patch("LOG_EVERY = 5\n")
    [inherited] = supervisor.all()
    assert (inherited.kind, inherited.at_step, inherited.args["new"]) == (PATCH, 0, True)
    steering, applied, answers = _rank()
    # the fork's rank, given the run's commands at its start
    fresh = RankSteering(steering.session, [inherited], AgreedAsAsked())
    assert [c.id for c in fresh.pending] == [inherited.id]
    global LOG_EVERY
    try:
        _train(fresh, 2)
        # after the first update: the boundary before the second step
        assert LOG_EVERY == 5 and [said[:3] for said in applied] == [(1, 0, 2)] and answers[0][2] is True
    finally:
        del LOG_EVERY
