"""The one table of command kinds: the notebook, the supervisor and the ranks look a command's kind up here.

A kind that is not nbtrain's own (registered with :func:`register`) travels with its commands: the notebook
sends its definition along (pickled by value), and the supervisor and the ranks register it as they learn it.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from nbtrain._cluster.command_kinds.adjust import Adjust
from nbtrain._cluster.command_kinds.checkpoint import CheckpointNow
from nbtrain._cluster.command_kinds.exec_code import Exec
from nbtrain._cluster.command_kinds.guard import Guard
from nbtrain._cluster.command_kinds.kind import CommandKind
from nbtrain._cluster.command_kinds.patch import Patch
from nbtrain._cluster.command_kinds.pause import Pause
from nbtrain._cluster.command_kinds.profile import Profile
from nbtrain._cluster.command_kinds.resume import Resume
from nbtrain._cluster.command_kinds.rewind import Rewind
from nbtrain._cluster.command_kinds.send import Send
from nbtrain._cluster.command_kinds.stacks import Stacks
from nbtrain._cluster.command_kinds.stop import Stop
from nbtrain._cluster.command_kinds.stop_after_epoch import StopAfterEpoch
from nbtrain._cluster.commands import Command

BUILT_IN: dict[str, CommandKind] = {kind.name: kind for kind in (
    Adjust(), Pause(), Resume(), CheckpointNow(), StopAfterEpoch(), Send(), Stacks(), Profile(), Rewind(), Guard(),
    Exec(), Patch(), Stop())}
_registered: dict[str, CommandKind] = dict(BUILT_IN)
_definitions: dict[str, bytes] = {}  # kinds registered here that are not nbtrain's own, pickled by value


def command_kind(name: str) -> CommandKind:
    """The kind named ``name``; a kind unknown here (a saved command of a kind registered in another process)
    is described by its name alone."""
    return _registered.get(name, _UNKNOWN)


def register(kind: CommandKind) -> CommandKind:
    """Add a kind of command (a :class:`CommandKind` subclass's instance) to this process's table; its commands
    carry its definition to the supervisor and the ranks. A name of nbtrain's own kinds is refused."""
    import cloudpickle

    if kind.name in BUILT_IN:
        raise ValueError(f"{kind.name!r} is one of nbtrain's own command kinds; give yours another name.")
    module = sys.modules.get(type(kind).__module__)
    if module is not None and not type(kind).__module__.startswith("nbtrain."):
        cloudpickle.register_pickle_by_value(module)
    _registered[kind.name] = kind
    _definitions[kind.name] = cloudpickle.dumps(kind)
    return kind


def definition(name: str) -> bytes | None:
    """What travels with a command of ``name``: its kind pickled by value, or None for nbtrain's own."""
    return _definitions.get(name)


def learn(name: str, data: bytes | None) -> CommandKind:
    """The kind of a command that arrived with ``data`` (its definition): registered here once."""
    if name not in _registered and data is not None:
        import cloudpickle

        _registered[name] = cloudpickle.loads(data)
        _definitions[name] = data
    return command_kind(name)


def describe(command: Command) -> str:
    """The command as the curves' marker and the run's events say it: ``lr 0.1 → 0.01 at step 1200``."""
    kind = command_kind(command.kind)
    step = command.applied_step if command.applied_step is not None else command.at_step
    where = "" if not kind.bound_to_step else f" at step {step}" if step >= 0 else " as the ranks come back"
    return kind.describe(command, where)


class _Unknown(CommandKind):
    name: ClassVar[str] = ""
    is_change: ClassVar[bool] = False

    def describe(self, command: Command, where: str) -> str:
        return f"command {command.kind!r}{where}"


_UNKNOWN = _Unknown()
