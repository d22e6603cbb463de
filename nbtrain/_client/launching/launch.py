"""``launch()``, ``attach()`` and ``runs()``: where every face of nbtrain starts or finds a run.

The magic, the launch panel and the lab sidebar all come here. ``launch()``
turns its keyword arguments into one :class:`~nbtrain._options.RunOptions`
(validated there), pickles the function, and starts the run's supervisor as a
detached actor; the returned :class:`~nbtrain._client.run.handle.Run` only reads.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from nbtrain import _options, _registry
from nbtrain._client import connection, warm
from nbtrain._client.launching import data_room
from nbtrain._client.launching.checks import (
    check_resources,
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
from nbtrain._client.launching.serialization import dumps_checked
from nbtrain._client.run.following import block_until_done
from nbtrain._client.run.handle import POLL_TIMEOUT_S, Run
from nbtrain._client.run.stored import StoredRunHandle, find_stored, stored_names, stored_summaries
from nbtrain._cluster.names import find_supervisor, run_names, wait_until_name_free
from nbtrain._cluster.spec import RunSpec
from nbtrain._exceptions import (
    RunExistsError,
    RunNotFoundError,
)
from nbtrain._options import RunOptions, refuses_unknown_keywords
from nbtrain._packing.runtime_env import packages_to_hold
from nbtrain._states import TERMINAL_STATE_NAMES, RunState


@refuses_unknown_keywords
def launch(
    train_fn: Callable[..., Any],
    *,
    name: str | None = None,
    config: dict[str, Any] | None = None,
    workers: int | tuple[int, int] = 2,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    max_failures: int = 0,
    wait: bool = False,
    resume: bool = False,
    total_steps: int | None = None,
    total_epochs: int | None = None,
    datasets: dict[str, Any] | None = None,
    storage: str | None = None,
    checkpoint_weights_only: bool = True,
    backend: str | None = None,
    precision: str | None = None,
    placement_strategy: str = "PACK",
    placement_timeout_s: float = 60.0,
    collective_timeout_s: float = 300.0,
    stall_timeout_s: float = 300.0,
    on_stall: str = "warn",
    stop_on_nan: bool = False,
    scale_lr: str | None = None,
    resize_interval_s: float = 10.0,
    gns: bool = False,
    adaptive_batch: tuple[int, int] | None = None,
    debug_capture_mb: float = 4.0,
    step_timing: bool = True,
    straggler_window_s: float = 10.0,
    flush_interval_s: float = 0.1,
    feed_relay: str = "auto",
    warm: bool = True,
    warm_idle_s: float = 600.0,
    env: dict[str, str] | None = None,
    runtime_env: dict[str, Any] | None = None,
    loggers: tuple[str, ...] | None = None,
    logger_dir: str | None = None,
) -> Run:
    """Start ``train_fn`` on ``workers`` DDP ranks on the connected cluster.

    ``train_fn`` takes the ``config`` dict or nothing. It may be defined in the
    notebook and use notebook classes and variables; they are pickled and sent.
    The run is owned by the cluster: it keeps going if the notebook goes away.
    With ``wait=True`` the call blocks until the run ends; Ctrl-C (the kernel's
    interrupt) then stops the run and says so.

    Args:
        train_fn: the training function, run on every rank; it takes ``config`` or nothing.
            Every other keyword is a run option, listed below.

    Returns:
        The :class:`Run`, started (ended, with ``wait=True``).

    Raises:
        InvalidOptionError: an option has a wrong type or value (nothing was started).
        NotConnectedError: no ``connect()`` first.
        NotSerializableError: something ``train_fn`` uses cannot be sent to the ranks.
        ResourcesUnavailableError: the cluster cannot hold the workers at all.
        RunExistsError: ``name`` is a live run's. An ended run's name is not refused: the new run is
            ``NAME-2`` (``NAME-3``…), said on stderr, and ``resume=True`` continues the ended run instead.
        RunNotFoundError: ``resume=True`` names no existing run.
        StorageError: the cluster cannot write ``storage=``.
        RunFailedError: with ``wait=True``, the run failed.

    Example::

        def train(config):
            model = nbtrain.prepare_model(Net())
            for step in range(config["steps"]):
                ...
                nbtrain.report(loss=loss.item())

        run = nbtrain.launch(train, config={"steps": 100}, workers=2)
        run.wait()
    """
    arguments = {key: value for key, value in locals().items() if key != "train_fn"}
    return start(train_fn, RunOptions(**arguments))


launch.__doc__ = (launch.__doc__ or "") + _options.describe()


def start(train_fn: Callable[..., Any], options: RunOptions) -> Run:
    """``launch()`` once its options are one validated value (the magic and the panel call this too)."""
    takes_config = check_signature(train_fn)
    named = options.name is not None  # a name of the user's may be an ended run's; a default one never is
    name = options.name or _default_name()
    config = dict(options.config or {})
    datasets = options.datasets
    options = dataclasses.replace(options, name=name, config=config, env=dict(options.env or {}), datasets=None,
                               total_epochs=options.total_epochs or _guess_epochs(config))
    launched_by = owner()
    # everything that can be checked here is, before the cluster is asked anything
    fn_bytes, modules = dumps_checked(train_fn)
    spec = RunSpec(options=options, fn_bytes=fn_bytes, fn_takes_config=takes_config, owner=launched_by, modules=modules)
    spec_bytes = pickled(spec)
    cluster = connection.current()
    if datasets:  # on a small cluster the ranks leave Ray Data a CPU (see data_room)
        options, note = data_room.leave_room_for_data(options, data_room.cluster_cpus())
        spec = dataclasses.replace(spec, options=options, notes=(note,) if note else ())
    if (uploaded := with_uploaded_paths(options)) is not options:
        options = uploaded
        spec = dataclasses.replace(spec, options=options)
    spec_bytes = pickled(spec)
    check_resources(options.min_workers, options.cpus_per_worker, options.gpus_per_worker)
    if options.storage and cluster.kind == "local":  # the notebook sees the cluster's disk: check now
        check_writable(options.storage)
    if (pool := warm.pool_for(options)) is not None:
        spec = dataclasses.replace(spec, warm_pool=pool)
        spec_bytes = pickled(spec)
    if options.resume:
        handle = _resume(name, spec, spec_bytes, datasets, cluster.address)
    else:
        handle, spec = _start_new(spec, spec_bytes, datasets, cluster.address, named)
        name, options = spec.name, spec.options
    _registry.record_launch(name, cluster.address, notebook=launched_by["notebook"], workers=options.max_workers,
                            total_steps=options.total_steps)
    run = Run(name, handle, cluster.address)
    if options.wait:
        block_until_done(run, launched=True)
        run.raise_if_failed()
    return run


NAME_TRIES = 5  # names tried by a launch that other launches keep beating to each one


def _start_new(spec: RunSpec, spec_bytes: bytes, datasets: dict[str, Any] | None, address: str,
               named: bool) -> tuple[Any, RunSpec]:
    """A new run's supervisor, and the spec it runs (renamed when the name asked for was an ended run's).

    An ended run keeps its name (``attach(NAME)`` still means it, ``resume=True`` continues it), so a launch
    of that name starts the next free ``NAME-2``, ``NAME-3``… and says so; a live run's name is refused.
    The name is chosen before the supervisor starts. Another launch may take it first (Ray refuses the
    actor's name, or the supervisor finds the run index holding it): then the name is chosen again.
    """
    from nbtrain._cluster.run.supervisor import supervisor_actor, supervisor_options

    asked = spec.name
    for tried in range(NAME_TRIES):
        name = _free_name(asked, address, look_for_ended=named or tried > 0)
        chosen = spec if name == asked else dataclasses.replace(
            spec, options=dataclasses.replace(spec.options, name=name), notes=(*spec.notes, ended_note(asked, name)))
        actor = supervisor_actor().options(**supervisor_options(name, packages_to_hold(chosen.options.runtime_env)))
        try:
            # datasets as an argument, not inside the pickled spec: Ray Client maps their object refs
            handle = actor.remote(spec_bytes if chosen is spec else pickled(chosen), datasets)
            wait_for_supervisor(handle, name)
        except ValueError:  # Ray: the actor's name is already taken
            if find_supervisor(name) is None:
                raise
            continue
        except RunExistsError:  # the supervisor found the name in the run index, and let it be
            continue
        if name != asked:
            print(ended_note(asked, name), file=sys.stderr)
        return handle, chosen
    raise RunExistsError(name_taken(asked, address))


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


def _live_state(supervisor: Any) -> str | None:
    """The state of the supervisor's run while it goes on; ``None`` once it has ended (the supervisor may be
    exiting, or gone)."""
    import ray

    try:
        state = str(ray.get(supervisor.summary.remote(), timeout=POLL_TIMEOUT_S)["state"])
    except ray.exceptions.ActorUnavailableError:
        return RunState.RESTARTING.value  # Ray restarts a supervisor whose process died: its run goes on
    except ray.exceptions.RayActorError:
        return None  # it exited as its run ended
    except ray.exceptions.GetTimeoutError:
        return "not answering"
    return None if state in TERMINAL_STATE_NAMES else state


def _resume(name: str, spec: RunSpec, spec_bytes: bytes, datasets: dict[str, Any] | None, address: str) -> Any:
    """``resume=True``: the run ``name`` goes on as a new attempt, by its supervisor or, once that has exited, from
    its files; the handle of the supervisor that carries it."""
    import ray

    existing = find_supervisor(name)
    stored = find_stored(name) if existing is None else None
    if existing is None and stored is None:
        msg = f"resume=True needs an existing run named {name!r}, and there is none on {address}."
        raise RunNotFoundError(msg)
    if existing is not None:
        try:
            state = ray.get(existing.resume.remote(spec_bytes, datasets), timeout=POLL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            state = "retired"  # it exited as the run had ended: resume from the files
        if state == "retired":
            wait_until_name_free(name)
            stored = find_stored(name)
        elif state != "resumed":
            msg = f"Run {name!r} cannot be resumed: it is {state}; only an ended run can be. Attach to it instead."
            raise RunExistsError(msg)
    if stored is not None:  # resume an ended run from its files: a new supervisor takes them up
        return _resume_stored(name, spec, datasets)
    return existing


def _resume_stored(name: str, spec: RunSpec, datasets: dict[str, Any] | None) -> Any:
    """Start a supervisor on an ended run's files (same launch, so it takes them up) and resume it."""
    import ray

    from nbtrain._cluster.run.supervisor import supervisor_actor, supervisor_options

    launch_id = ray.get(StoredRunHandle(name).summary.remote(), timeout=POLL_TIMEOUT_S).get("launch")
    spec = dataclasses.replace(spec, launch_id=launch_id or spec.launch_id)
    spec_bytes = pickled(spec)
    handle = supervisor_actor().options(**supervisor_options(name, packages_to_hold(spec.options.runtime_env))).remote(
        spec_bytes, datasets)
    wait_for_supervisor(handle, name)
    state = ray.get(handle.resume.remote(spec_bytes, datasets), timeout=POLL_TIMEOUT_S)
    # a run whose supervisor vanished mid-run is taken up (restarted) by the new one at once
    if state != "resumed" and state not in _GOING:
        msg = f"Run {name!r} cannot be resumed: it is {state}. Attach to it to see why."
        raise RunExistsError(msg)
    return handle


_GOING = ("pending", "starting", "running", "restarting")


def _guess_epochs(config: dict[str, Any]) -> int | None:
    value = config.get("epochs")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _default_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + os.urandom(2).hex()


def attach(name: str) -> Run:
    """A :class:`Run` for a run started elsewhere (another kernel, before a restart), with its whole history.

    Args:
        name: the run's name, as ``runs()`` lists it.

    Returns:
        The :class:`Run`, live or ended.

    Raises:
        RunNotFoundError: the connected cluster has no run of that name (the message lists those it has).
        NotConnectedError: no ``connect()`` first.

    Example::

        run = nbtrain.attach("cifar")
        run.dashboard()
    """
    cluster = connection.current()
    handle = find_supervisor(name) or find_stored(name)
    if handle is None:
        known = ", ".join(sorted({*run_names(), *stored_names()})) or "none"
        msg = f"No run named {name!r} on {cluster.address}. Runs there: {known}. See nbtrain.runs()."
        raise RunNotFoundError(msg)
    run = Run(name, handle, cluster.address)
    run.refresh()
    return run


def runs() -> list[dict[str, Any]]:
    """Every run on the connected cluster: name, state, attempt, step, workers, started, owner.

    Returns:
        One dict per run (``name``, ``state``, ``attempt``, ``step``, ``total_steps``, ``world_size``,
        ``started``, ``ended``, ``owner``, ``error``), live and ended runs alike.

    Raises:
        NotConnectedError: no ``connect()`` first.

    Example::

        [r["name"] for r in nbtrain.runs() if r["state"] == "running"]
    """
    return [{key: summary.get(key) for key in ("name", "state", "attempt", "step", "total_steps", "world_size",
                                               "started", "ended", "owner", "error")}
            for summary in run_summaries()]


def run_summaries() -> list[dict[str, Any]]:
    """Each run's full summary: from its supervisor while it goes on, from its files once ended
    (``{"name", "state": "unknown"}`` for one that does not answer)."""
    import ray

    connection.current()
    handles = [(name, handle) for name in run_names() if (handle := find_supervisor(name)) is not None]
    refs = [(name, handle.summary.remote()) for name, handle in handles]
    found, answered = [], []
    for name, ref in refs:
        try:
            found.append(ray.get(ref, timeout=POLL_TIMEOUT_S))
        except ray.exceptions.RayActorError:
            continue  # it exited just now, as its run ended: its files answer below
        except Exception:  # noqa: BLE001 - a restarting supervisor must not hide the others
            found.append({"name": name, "state": "unknown"})
        answered.append(name)
    ended = stored_summaries(exclude=answered)
    return sorted(found + ended, key=lambda summary: summary.get("started") or 0.0)
