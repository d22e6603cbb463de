"""The one path that starts a run, whoever asks: ``launch()`` (the magic, the panel), ``run.fork()``, a resume.

Two steps, each written once. :func:`checked_spec` turns a training function (or the parent's pickled one)
and a :class:`~nbtrain._options.RunOptions` into a :class:`Checked` spec: the function's signature and
pickling, the upload of ``runtime_env``'s local folders, room for Ray Data beside the ranks, what the
cluster can hold, a writable ``storage=``, the warm pool — and the spec pickled once. :func:`start` then
starts a supervisor for it: a live run's name is refused, an ended run's gives the next free ``NAME-2``…,
a launch that another one beats to the name chooses again, and the run is recorded for the sidebar.
:func:`resume` hands the same checked spec to an ended run instead. A sweep checks its trials' template
here too (see :mod:`~nbtrain._client.entry.sweep_start`); Ray Tune then starts each trial's run on the cluster.

It hands back the supervisor's actor handle, not a :class:`~nbtrain.Run`: ``launch()`` (in ``_client/entry``) and
``run.fork()`` (in ``_client/run``) wrap it, and both import this folder, which imports neither of theirs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from nbtrain import _registry
from nbtrain._client import warm
from nbtrain._client.connecting import connection
from nbtrain._client.connecting.head_tasks import is_stored, stored_names, stored_summary
from nbtrain._client.launching import room
from nbtrain._client.launching.checks import (
    check_signature,
    check_writable,
    ended_note,
    name_taken,
    numbered_name,
    owner,
    pickled,
    wait_for_supervisor,
    with_uploaded_paths,
)
from nbtrain._client.launching.serialization import check_values, dumps_checked
from nbtrain._cluster.names import find_supervisor, run_names, wait_until_name_free
from nbtrain._cluster.spec import RunSpec
from nbtrain._exceptions import RunExistsError, RunNotFoundError
from nbtrain._options import RunOptions
from nbtrain._packing.runtime_env import local_paths, packages_to_hold
from nbtrain._states import TERMINAL_STATE_NAMES, RunState

NAME_TRIES = 5  # names tried by a launch that other launches keep beating to each one
ANSWER_S = 15.0  # a supervisor's answer to summary() or resume()
_GOING = ("pending", "starting", "running", "restarting")


@dataclasses.dataclass(frozen=True)
class Code:
    """The training function as the ranks get it: cloudpickle bytes, the notebook modules sent with it, and
    whether it takes the config. A fork without ``train_fn=`` reuses its parent's."""

    fn_bytes: bytes
    modules: tuple[str, ...]
    takes_config: bool

    @classmethod
    def of(cls, train_fn: Callable[..., Any]) -> Code:
        takes_config = check_signature(train_fn)
        fn_bytes, modules = dumps_checked(train_fn)
        return cls(fn_bytes, modules, takes_config)


@dataclasses.dataclass(frozen=True)
class Checked:
    """A spec that passed every check the notebook can make, and its bytes (pickled once)."""

    spec: RunSpec
    spec_bytes: bytes
    datasets: dict[str, Any] | None  # sent beside the bytes: Ray Client maps their object references
    named: bool                      # the name is the user's (it may be an ended run's); a default one never is
    address: str


def checked_spec(code: Code | Callable[..., Any], options: RunOptions, *, notes: tuple[str, ...] = (),
                 initial_checkpoint: tuple[dict[str, Any], bytes] | None = None,
                 parent: dict[str, Any] | None = None, settings_at_start: dict[str, Any] | None = None,
                 patches_at_start: tuple[str, ...] = (),
                 named: bool | None = None) -> Checked:
    """``options`` (validated) and the function, checked and pickled: everything the notebook can refuse is
    refused here, before any run exists. ``named``: whether ``options.name`` is the user's (default: given)."""
    launch_called = time.time()  # the launch's first phase (see launch_phases)
    code = code if isinstance(code, Code) else Code.of(code)
    named = options.name is not None if named is None else named
    datasets = options.datasets
    config = dict(options.config or {})
    options = dataclasses.replace(options, name=options.name or _default_name(), config=config, datasets=None,
                                  env=dict(options.env or {}), total_epochs=options.total_epochs or _epochs(config))
    # the config is sent as the function is: refused before the cluster is asked anything, naming the value
    check_values({f"config[{key!r}]": value for key, value in config.items()})
    cluster = connection.current()
    options, note = room.make_room(options, with_data=bool(datasets))  # see room: Ray Data's CPU on a small cluster
    notes = (*notes, note) if note else notes
    given = options.runtime_env if local_paths(options.runtime_env) else None
    options = with_uploaded_paths(options)
    if options.storage and cluster.kind == "local":  # the notebook sees the cluster's disk: check now
        check_writable(options.storage)
    spec = RunSpec(options=options, fn_bytes=code.fn_bytes, fn_takes_config=code.takes_config, owner=owner(),
                   modules=code.modules, notes=notes, warm_pool=warm.pool_for(options),
                   initial_checkpoint=initial_checkpoint, parent=parent, settings_at_start=settings_at_start,
                   patches_at_start=patches_at_start,
                   dataset_names=tuple(datasets or ()), runtime_env_given=given, launch_called=launch_called)
    spec_bytes = pickled(spec)
    warm.prestart(spec.warm_pool, options)  # the pickled spec is good: its first ranks may start now
    return Checked(spec, spec_bytes, datasets, named=named, address=cluster.address)


def start(checked: Checked) -> tuple[Any, RunSpec]:
    """A new run's supervisor for ``checked``, waited for and recorded, and the spec it runs (renamed when the
    name asked for was an ended run's).

    An ended run keeps its name (``attach(NAME)`` still means it, ``resume=True`` continues it), so a run of
    that name starts as the next free ``NAME-2``, ``NAME-3``… and says so; a live run's name is refused.
    The name is chosen before the supervisor starts. Another launch may take it first (Ray refuses the
    actor's name, or the supervisor finds the run index holding it): then the name is chosen again.
    """
    from nbtrain._cluster.supervisor.supervisor import spec_parts, supervisor_actor, supervisor_options

    spec = checked.spec
    asked = spec.name
    holds = packages_to_hold(spec.options.runtime_env)
    for tried in range(NAME_TRIES):
        name = _free_name(asked, checked.address, look_for_ended=checked.named or tried > 0)
        chosen = spec if name == asked else dataclasses.replace(
            spec, options=dataclasses.replace(spec.options, name=name), notes=(*spec.notes, ended_note(asked, name)))
        actor = supervisor_actor().options(**supervisor_options(name, holds))
        try:
            handle = actor.remote(*spec_parts(checked.spec_bytes if chosen is spec else pickled(chosen)),
                                  datasets=checked.datasets)
            wait_for_supervisor(handle, name, ended=functools.partial(_ended_already, name))
        except ValueError:  # Ray: the actor's name is already taken
            if find_supervisor(name) is None:
                raise
            continue
        except RunExistsError:  # the supervisor found the name in the run index, and let it be
            continue
        if name != asked:
            print(ended_note(asked, name), file=sys.stderr)
        _record(chosen, checked.address)
        return handle, chosen
    raise RunExistsError(name_taken(asked, checked.address))


def resume(checked: Checked) -> Any:
    """``resume=True``: the run of ``checked``'s name goes on as a new attempt, by its supervisor or, once that
    has exited, from its files; the handle of the supervisor that carries it, recorded."""
    import ray

    name, address = checked.spec.name, checked.address
    existing = find_supervisor(name)
    stored = is_stored(name) if existing is None else False
    if existing is None and not stored:
        msg = f"resume=True needs an existing run named {name!r}, and there is none on {address}."
        raise RunNotFoundError(msg)
    handle = existing
    if existing is not None:
        try:
            state = ray.get(existing.resume.remote(checked.spec_bytes, checked.datasets), timeout=ANSWER_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            state = "retired"  # it exited as the run had ended: resume from the files
        if state == "retired":
            wait_until_name_free(name)
            stored = is_stored(name)
        elif state != "resumed":
            msg = f"Run {name!r} cannot be resumed: it is {state}; only an ended run can be. Attach to it instead."
            raise RunExistsError(msg)
    if stored:  # resume an ended run from its files: a new supervisor takes them up
        handle = _resume_stored(checked)
    _record(checked.spec, address)
    return handle


def _resume_stored(checked: Checked) -> Any:
    """Start a supervisor on an ended run's files (as the same launch, so that it takes them up) and resume it."""
    import ray

    from nbtrain._cluster.supervisor.supervisor import spec_parts, supervisor_actor, supervisor_options

    name = checked.spec.name
    launch_id = stored_summary(name).get("launch")
    # the one spec pickled again: it must name the files' launch, known only now that the run has exited
    spec_bytes = pickled(dataclasses.replace(checked.spec, launch_id=launch_id or checked.spec.launch_id))
    holds = packages_to_hold(checked.spec.options.runtime_env)
    handle = supervisor_actor().options(**supervisor_options(name, holds)).remote(*spec_parts(spec_bytes),
                                                                                  datasets=checked.datasets)
    wait_for_supervisor(handle, name)
    state = ray.get(handle.resume.remote(spec_bytes, checked.datasets), timeout=ANSWER_S)
    # a run whose supervisor vanished mid-run is taken up (restarted) by the new one at once
    if state != "resumed" and state not in _GOING:
        msg = f"Run {name!r} cannot be resumed: it is {state}. Attach to it to see why."
        raise RunExistsError(msg)
    return handle


def _free_name(name: str, address: str, look_for_ended: bool) -> str:
    """``name``, or the next free ``NAME-N`` when an ended run holds it (``look_for_ended``: one task on the head
    lists the kept runs; without it only a supervisor still exiting shows an ended run). A live run's name raises
    :class:`RunExistsError`."""
    existing = find_supervisor(name)
    if existing is not None and (state := _live_state(existing)) is not None:
        raise RunExistsError(name_taken(name, address, state))
    kept = set(stored_names()) if look_for_ended or existing is not None else set()
    if existing is None and name not in kept:
        return name
    return numbered_name(name, kept | set(run_names()))


def _ended_already(name: str) -> bool:
    """Whether the run ``name`` (a name no kept run had when it was chosen) ran to its end already."""
    return is_stored(name) and stored_summary(name).get("state") in TERMINAL_STATE_NAMES


def _live_state(supervisor: Any) -> str | None:
    """The state of the supervisor's run while it goes on; ``None`` once it has ended (the supervisor may be
    exiting, or gone)."""
    import ray

    try:
        state = str(ray.get(supervisor.summary.remote(), timeout=ANSWER_S)["state"])
    except ray.exceptions.ActorUnavailableError:
        return RunState.RESTARTING.value  # Ray restarts a supervisor whose process died: its run goes on
    except ray.exceptions.RayActorError:
        return None  # it exited as its run ended
    except ray.exceptions.GetTimeoutError:
        return "not answering"
    return None if state in TERMINAL_STATE_NAMES else state


def _record(spec: RunSpec, address: str) -> None:
    """The run in this home's registry, for the lab sidebar and ``nbtrain runs``."""
    _registry.record_launch(spec.name, address, notebook=spec.owner.get("notebook"),
                            workers=spec.options.max_workers, total_steps=spec.options.total_steps)


def _epochs(config: dict[str, Any]) -> int | None:
    value = config.get("epochs")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _default_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + os.urandom(2).hex()
