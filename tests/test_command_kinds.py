"""A kind of command is one module, registered in one table: the notebook, the supervisor and the ranks look it
up and do what it says. A kind of the tests' own (``tag``, in ``_tagging_kind.py``) goes through the same
supervisor and rank code as nbtrain's, its definition travelling with its commands; the real notebook ->
supervisor -> ranks path is in ``test_steering.py``."""

from __future__ import annotations

import importlib
import pkgutil
from types import SimpleNamespace

import pytest
import torch
from _steering_fakes import AgreedAsAsked

import nbtrain._cluster.command_kinds as command_kinds
from nbtrain import InvalidOptionError
from nbtrain._cluster.command_kinds import table
from nbtrain._cluster.command_kinds.kind import CommandKind
from nbtrain._cluster.commands import ADJUST, Command
from nbtrain._cluster.rank.rank_steering import RankSteering
from nbtrain._cluster.supervisor.run_steering import RunSteering

from _tagging_kind import Tag

pytestmark = pytest.mark.quick


def test_each_of_nbtrains_kinds_is_one_module_and_one_entry_of_the_table():
    modules = {name for _, name, _ in pkgutil.iter_modules(command_kinds.__path__)} - {"kind", "table"}
    declared = {}
    for module in modules:
        found = [value for value in vars(importlib.import_module(f"{command_kinds.__name__}.{module}")).values()
                 if isinstance(value, type) and issubclass(value, CommandKind) and value is not CommandKind
                 and value.__module__.endswith(f".{module}")]
        assert len(found) == 1, (module, found)
        declared[found[0].name] = module
    assert set(declared) == set(table.BUILT_IN)
    assert all(type(table.command_kind(name)).__module__.endswith(module) for name, module in declared.items())


def test_a_kind_cannot_take_the_name_of_one_of_nbtrains():
    class Impostor(Tag):
        name = ADJUST

    with pytest.raises(ValueError, match="'adjust' is one of nbtrain's own command kinds; give yours another name"):
        table.register(Impostor())


def test_a_saved_command_of_a_kind_unknown_here_is_described_by_its_name():
    command = Command(4, "someone_elses", {}, at_step=9, issued=1.0, applied_step=10)
    assert table.describe(command) == "command 'someone_elses' at step 10"
    assert "definition" not in command.as_dict()


def test_a_kind_of_its_own_is_checked_issued_applied_and_described_through_the_kinds_table(capsys):
    """Issued at the supervisor and applied by a rank that learn the kind from the command's definition alone."""
    tag = Tag()
    definition = table.register(tag) and table.definition(tag.name)
    assert definition is not None
    with pytest.raises(InvalidOptionError, match=r"tag\(text=...\) is a string"):
        table.command_kind("tag").check({"text": None})
    events: list[tuple[str, str]] = []
    supervisor = RunSteering(record=lambda kind, message, **_fields: events.append((kind, message)),
                             persist=lambda: None)
    applied: list[tuple] = []
    session = SimpleNamespace(
        supervisor=SimpleNamespace(command_applied=SimpleNamespace(remote=lambda *args: applied.append(args))),
        context=SimpleNamespace(rank=0), uses_loader=False, report_calls=0, last_step=0, step=0, epoch=0,
        commands_due=lambda due: None, timing=None, resumed_step=None)
    rank = RankSteering(session, [], AgreedAsAsked())
    model = torch.nn.Linear(2, 1)
    optimizer = rank.steer(torch.optim.SGD(model.parameters(), lr=0.5))
    with pytest.raises(ValueError, match="no rank runs to tag"):
        supervisor.issue("tag", {"text": "x"}, {}, live=True, definition=definition)
    issued = supervisor.issue("tag", {"text": "here"}, {0: rank.beat()}, live=True, definition=definition)
    assert issued.args == {"text": "here", "ranks": [0]} and issued.definition == definition
    rank.learn([issued])
    try:
        for _ in range(issued.at_step):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
    finally:
        rank.unhook()
    [(command_id, rank_said, step, before, when)] = applied
    assert (command_id, rank_said, step, before) == (1, 0, issued.at_step, {"lr": [0.5]})
    assert f"tagged 'here' at step {issued.at_step}" in capsys.readouterr().out
    supervisor.applied(command_id, 0, step, before, when, world_size=1)
    assert events == [("change", f"tag 'here' at step {issued.at_step}")]
    assert [change["description"] for change in supervisor.changes()] == [f"tag 'here' at step {issued.at_step}"]
