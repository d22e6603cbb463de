"""Starting a sweep: ``nbtrain.tune()`` and the ``%%ray_tune`` magic's path, checked and named.

The sweep's options are checked here, and its trials' run template by the same checks as any run's
(:func:`~nbtrain._client.launching.starting.checked_spec`), before the sweep's supervisor exists;
the sweep's supervisor (:mod:`nbtrain._cluster.sweep.sweep_supervisor`) then runs Ray Tune on the cluster,
and :class:`~nbtrain._client.entry.sweep.Sweep` reads it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

from nbtrain import _options, _sweep_options
from nbtrain._client.entry.sweep import (
    POLL_TIMEOUT_S,
    SET_BY_THE_SWEEP,
    TERMINAL,
    Sweep,
    _find_handle,
    _live_sweep_names,
    stored_sweep_names,
)
from nbtrain._client.launching import starting
from nbtrain._client.launching.checks import ended_note, numbered_name, owner
from nbtrain._cluster.spec import SweepSpec
from nbtrain._exceptions import InvalidOptionError, NbtrainError, RunExistsError
from nbtrain._options import RunOptions, check_keywords
from nbtrain._packing import code_origin
from nbtrain._packing.runtime_env import packages_to_hold
from nbtrain._sweep_options import SweepOptions

SWEEP_START_S = 30.0
NAME_TRIES = 5  # names tried by a sweep that other sweeps keep beating to each one


def tune(
    train_fn: Any,
    *,
    space: dict[str, Any] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    num_samples: int = 1,
    scheduler: Any = None,
    max_t: int = 100,
    grace_period: int = 1,
    reduction_factor: float = 4,
    perturbation_interval: int = 4,
    time_attr: str = "training_iteration",
    search_alg: Any = None,
    seed: int | None = None,
    workers_per_trial: int = 2,
    max_concurrent: int | None = None,
    name: str | None = None,
    wait: bool = False,
    **run_options: Any,
) -> Sweep:
    """Sweep ``train_fn``'s hyperparameters with Ray Tune; each trial is an nbtrain run.

    ``space`` maps config keys to Ray Tune distributions (merged over ``config=``);
    one iteration is one report of ``metric`` by rank 0. Every other keyword is a
    run option (``config``, ``cpus_per_worker``, ``max_failures``, ``storage``,
    ``precision``…) applied to each trial. The sweep options are listed in the options
    reference (and ``%%ray_tune --help``).

    Args:
        train_fn: the training function, run on every rank of every trial.

    Returns:
        The :class:`Sweep`, started (ended, with ``wait=True``).

    Raises:
        InvalidOptionError: a sweep or run option is wrong, or one the sweep sets itself was given.
        RunExistsError: a sweep of that ``name`` is still going (an ended one's name starts ``name-2``, ``-3``…).
        NotConnectedError: no ``connect()`` first.
        SweepFailedError: with ``wait=True``, the sweep failed.

    Example::

        from ray import tune
        sweep = nbtrain.tune(train, space={"lr": tune.loguniform(1e-4, 1e-1)}, metric="loss", mode="min",
                             num_samples=8, scheduler="asha", max_t=10)
        sweep.dashboard()
        sweep.best.run.load_checkpoint()
    """
    arguments = {key: value for key, value in locals().items() if key not in ("train_fn", "run_options")}
    _check_run_keywords(run_options)  # a typo first: it may be why another value looks wrong
    options = SweepOptions(**arguments)
    return start_sweep(train_fn, options, run_options)


def _check_run_keywords(run_options: dict[str, Any]) -> None:
    for key in run_options:
        if key in SET_BY_THE_SWEEP:
            instead = SET_BY_THE_SWEEP[key]
            msg = (f"{key} is set by the sweep for each trial" + (f"; use {instead}" if instead else "") +
                   ". Leave it out of tune().")
            raise InvalidOptionError(msg)
    check_keywords(run_options, [*(field.name for field in _sweep_options.fields()),
                                 *(field.name for field in _options.fields() if field.name not in SET_BY_THE_SWEEP)],
                   "tune()", "nbtrain.tune")


def start_sweep(train_fn: Any, options: SweepOptions, run_options: dict[str, Any]) -> Sweep:
    """``tune()`` once its options are validated (the magic calls this too)."""
    import ray

    from nbtrain._cluster.sweep.sweep_supervisor import SweepSupervisor, sweep_supervisor_options

    _check_run_keywords(run_options)
    _check_scheduler(options.scheduler)
    code = starting.Code.of(train_fn)
    if not code.takes_config:
        msg = "A sweep's training function takes the config: def train(config): ... (the sampled values are in it)."
        raise InvalidOptionError(msg)
    asked = options.name or time.strftime("sweep-%Y%m%d-%H%M%S")
    # every trial's run is this template with its own name, config and Ray Tune's placement group: checked
    # (uploads, room for Ray Data, resources, storage, this session's warm pool) as launch() checks a run
    checked = starting.checked_spec(code, RunOptions(**run_options, workers=options.workers_per_trial))
    trial_run, datasets, address = checked.spec, checked.datasets, checked.address
    trial_run = dataclasses.replace(trial_run, launch_called=None)  # a trial starts when Tune says: no phases
    holds = packages_to_hold(trial_run.options.runtime_env)
    for _ in range(NAME_TRIES):  # another sweep may take the name chosen before this one starts: choose again
        name = _free_sweep_name(asked, address)
        options = dataclasses.replace(options, name=name)
        spec = SweepSpec(options=options, trial_run=trial_run, owner=owner())
        try:
            handle = ray.remote(SweepSupervisor).options(**sweep_supervisor_options(name, holds)).remote(
                code_origin.dumps(spec), datasets)
            break
        except ValueError:  # Ray: the actor's name is already taken
            if _find_handle(name) is None:
                raise
    else:
        raise RunExistsError(f"Sweep names {asked!r}, {asked}-2… were each taken by another sweep as this one "
                             f"started. Pick another name.")
    if name != asked:
        print(ended_note(asked, name, kind="sweep"), file=sys.stderr)
    sweep = Sweep(name, handle, address)
    try:
        sweep.cached = ray.get(handle.poll.remote(0, 0.0), timeout=SWEEP_START_S)
    except ray.exceptions.RayActorError as exc:
        raise NbtrainError(f"Sweep {name!r} could not start its supervisor on the cluster: {exc}") from None
    if options.wait:
        sweep.wait()
    return sweep


def _free_sweep_name(name: str, address: str) -> str:
    """``name``, or the next free ``NAME-2``, ``NAME-3``… when an ended sweep holds it (the ended sweep is kept: its
    trials' runs are ``NAME-t<N>``, the new sweep's ``NAME-2-t<N>``). A sweep still going keeps its name."""
    import ray

    handle = _find_handle(name)
    if handle is not None:
        try:
            state = ray.get(handle.poll.remote(0, 0.0), timeout=POLL_TIMEOUT_S)["state"]
        except ray.exceptions.RayActorError:
            state = "ended"  # it exited as the sweep ended
        if state not in TERMINAL and state != "ended":
            raise RunExistsError(f"Sweep {name!r} is still going on {address} ({state}): a live sweep's name is "
                                 f"its own. Pick another name, or attach to it with nbtrain.attach_sweep({name!r}).")
    kept = set(stored_sweep_names())
    if handle is None and name not in kept:
        return name
    return numbered_name(name, kept | set(_live_sweep_names()))


def _check_scheduler(scheduler: Any) -> None:
    """Refuse synchronous HyperBand: it pauses trials at each rung and resumes the best later, and a
    trial (an nbtrain run) is stopped, not paused. PBT restarts a trial from another's checkpoint,
    which a trial supports (its next run starts from that checkpoint)."""
    from ray.tune.schedulers import HyperBandScheduler

    if isinstance(scheduler, HyperBandScheduler):
        msg = (f"scheduler (--scheduler): {type(scheduler).__name__} pauses trials at each rung and resumes them "
               f"later, which nbtrain's trials (each an nbtrain run) do not do. Use scheduler='hyperband' "
               f"(asynchronous HyperBand: it stops trials instead) or 'asha'.")
        raise InvalidOptionError(msg)
