"""Hyperparameter sweeps from the notebook: ``nbtrain.tune()``, :class:`Sweep`, ``attach_sweep``, ``sweeps``.

A sweep runs Ray Tune on the cluster (see :mod:`nbtrain._cluster.sweep.sweep_supervisor`);
each trial is an nbtrain run named ``<sweep>-t<N>``. The notebook only reads the
sweep's trial table (one long poll for all trials) and, for a trial it looks
into, that trial's run.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

from nbtrain._client import connection, warm
from nbtrain._client.launching.checks import (
    check_resources,
    check_signature,
    ended_note,
    numbered_name,
    owner,
    with_uploaded_paths,
)
from nbtrain._client.launching.launch import attach
from nbtrain._client.launching.serialization import dumps_checked
from nbtrain._client.run.handle import Run
from nbtrain._client.run.stored import on_head
from nbtrain._cluster.names import NAMESPACE, sweep_actor_name
from nbtrain._cluster.spec import RunSpec, SweepSpec
from nbtrain._exceptions import InvalidOptionError, NbtrainError, RunExistsError, RunNotFoundError, SweepFailedError
from nbtrain._options import RunOptions
from nbtrain._packing import code_origin
from nbtrain._packing.runtime_env import packages_to_hold
from nbtrain._sweep_options import SweepOptions

POLL_TIMEOUT_S = 30.0
TRIAL_STOP_S = 70.0  # the sweep's supervisor gives a trial's run 60 s to stop
SWEEP_START_S = 30.0
NAME_TRIES = 5  # names tried by a sweep that other sweeps keep beating to each one
TERMINAL = ("succeeded", "failed", "stopped")
# Run options a sweep sets itself for each trial: given to tune(), they would mean something else.
SET_BY_THE_SWEEP = {"workers": "workers_per_trial", "name": "name (the sweep's; trial N's run is <name>-t<N>)",
                    "wait": "wait (the sweep's)", "resume": None}


@dataclasses.dataclass
class Trial:
    """One trial as the sweep's table had it when read (:attr:`Sweep.trials`, :attr:`Sweep.best`): ``config``
    (the sampled values), ``state``, ``iterations`` (rank 0's reports of the metric), ``last`` and ``best``
    (its values), ``stop_reason``, ``error``, ``waiting_for`` (a pending trial's missing resources), ``curve``
    (``(iteration, value)`` pairs). Example: ``sweep.best.run.load_checkpoint()``.
    """

    index: int
    id: str
    config: dict[str, Any]
    state: str                   # pending, running, succeeded, stopped, failed
    iterations: int              # rank 0's reports of the metric so far (Tune's training_iteration)
    last: float | None           # the metric's latest value
    best: float | None           # its best value (by the sweep's mode)
    stop_reason: str | None      # e.g. "stopped by ASHA at rung 1 (training_iteration 4)"
    error: str | None
    run_name: str | None
    waiting_for: str | None      # a pending trial: the resources it waits for
    curve: list[tuple[int, float]]
    _sweep: Sweep | None = dataclasses.field(default=None, repr=False)

    @property
    def run(self) -> Run:
        """The trial's nbtrain :class:`Run`, attached (every rank's metrics, logs and checkpoints).

        Raises:
            RunNotFoundError: the trial has not started yet, so it has no run.
        """
        if self.run_name is None:
            msg = f"trial {self.index} has not started yet ({self.waiting_for or 'pending'}): it has no run."
            raise RunNotFoundError(msg)
        return attach(self.run_name)

    def stop(self) -> None:
        """Stop this trial; returns once its run has stopped. The sweep goes on with the others.

        Raises:
            RunNotFoundError: the sweep no longer lists this trial.

        Example::

            for trial in sweep.trials:
                if trial.last is not None and trial.last > 2.0:
                    trial.stop()
        """
        if self._sweep is not None:
            self._sweep.stop_trial(self.index)


class Sweep:
    """A sweep on the cluster, from :func:`tune` or :func:`attach_sweep`. Each read (``state``, ``trials``,
    ``best``, ``results_frame()``) is one call for the whole trial table, kept as ``cached``; a trial's own
    history is its :attr:`Trial.run`. Once the sweep has ended, its stored record answers.
    """

    def __init__(self, name: str, handle: Any, address: str) -> None:
        self.name = name
        self._handle = handle
        self.address = address
        self.cached: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"<Sweep {self.name!r} {self.cached.get('state', '?')}, {len(self.cached.get('trials', []))} trials>"

    # -------------------------------------------------------------- reading
    def refresh(self, wait_s: float = 0.0) -> dict[str, Any]:
        """Read the sweep's table now, and keep it as ``cached``.

        Args:
            wait_s: when > 0, a long poll: answer as soon as the table changes, or after ``wait_s``.

        Returns:
            The table, with ``state``, ``metric``, ``mode``, ``trials`` (one dict per trial), ``error``...

        Raises:
            RunNotFoundError: the sweep has ended and left no record on the cluster.
        """
        import ray

        if self.cached.get("state") in TERMINAL and self._handle is None:
            return self.cached
        if self._handle is not None:
            try:
                self.cached = ray.get(self._handle.poll.remote(self.cached.get("version", 0), wait_s),
                                      timeout=wait_s + POLL_TIMEOUT_S)
                return self.cached
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._handle = None  # it finished and retired: its record answers from now on
        self.cached = _stored_record(self.name)
        return self.cached

    @property
    def state(self) -> str:
        """``"running"`` while trials go on, then ``"succeeded"``, ``"failed"`` or ``"stopped"``."""
        return str(self.refresh().get("state"))

    @property
    def trials(self) -> list[Trial]:
        """Every :class:`Trial`, by index, as the table has them now."""
        return self._trials(self.refresh())

    def _trials(self, answer: dict[str, Any]) -> list[Trial]:
        return [Trial(index=t["index"], id=t["id"], config=t["config"], state=t["state"], iterations=t["iterations"],
                      last=t["last"], best=t["best"], stop_reason=t["stop_reason"], error=t["error"],
                      run_name=t["run"], waiting_for=t["waiting_for"], curve=[tuple(p) for p in t["curve"]],
                      _sweep=self) for t in answer.get("trials", [])]

    @property
    def best(self) -> Trial | None:
        """The :class:`Trial` with the best value of the metric (by the sweep's ``mode``), failed trials left out;
        ``None`` before any report."""
        answer = self.refresh()
        scored = [t for t in self._trials(answer) if t.best is not None and t.state != "failed"]
        if not scored:
            return None
        pick = min if answer["mode"] == "min" else max
        return pick(scored, key=lambda t: t.best)  # type: ignore[arg-type,return-value]

    def results_frame(self) -> Any:
        """The trial table as a pandas DataFrame, to sort and plot the sweep's results.

        Returns:
            One row per trial, indexed by ``trial``, with its config values, ``state``, ``iterations``,
            ``best_<metric>``, ``last_<metric>``, ``stop_reason`` and ``run`` (an empty frame before any trial).

        Example::

            sweep.results_frame().sort_values("best_loss").head()
        """
        import pandas as pd

        answer = self.refresh()
        metric = answer["metric"]
        rows = [{"trial": t.index, **t.config, "state": t.state, "iterations": t.iterations,
                 f"best_{metric}": t.best, f"last_{metric}": t.last, "stop_reason": t.stop_reason,
                 "run": t.run_name} for t in self._trials(answer)]
        return pd.DataFrame(rows).set_index("trial") if rows else pd.DataFrame()

    # -------------------------------------------------------------- acting
    def wait(self, timeout: float | None = None) -> str:
        """Block until the sweep ends and return its state. Ctrl-C stops waiting, not the sweep.

        Args:
            timeout: seconds to wait at most; ``None`` waits for the end.

        Returns:
            ``"succeeded"`` or ``"stopped"``.

        Raises:
            SweepFailedError: the sweep failed (a failed trial does not fail the sweep).
            TimeoutError: ``timeout`` passed first; the sweep goes on.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        answer = self.refresh()
        while answer.get("state") not in TERMINAL:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                msg = f"sweep {self.name!r} is still {answer.get('state')} after {timeout:g} s"
                raise TimeoutError(msg)
            answer = self.refresh(wait_s=min(left or 5.0, 5.0))
        self.raise_if_failed()
        return str(answer["state"])

    def raise_if_failed(self) -> None:
        """Raise :class:`SweepFailedError` (with why) if the sweep has failed, as of the last read."""
        if self.cached.get("state") == "failed":
            raise SweepFailedError(f"Sweep {self.name!r} failed: {self.cached.get('error')}")

    def stop(self, timeout: float = 60.0) -> str:
        """Stop every trial and end the sweep; returns once Ray Tune has stopped them.

        Args:
            timeout: seconds the sweep's supervisor gives Ray Tune to stop the trials.

        Returns:
            The sweep's state afterwards (an ended sweep's state, unchanged).
        """
        import ray

        if self._handle is None:
            return self.state
        try:
            ray.get(self._handle.stop.remote(timeout), timeout=timeout + POLL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            pass  # it ended meanwhile
        return self.state

    def stop_trial(self, index: int) -> None:
        """Stop one trial; returns once its run has stopped. The sweep goes on with the others (as
        :meth:`Trial.stop`).

        Args:
            index: the trial's index, as :attr:`trials` and the sweep's dashboard number them.

        Raises:
            RunNotFoundError: the sweep has no trial ``index``.
        """
        import ray

        found = [t for t in self.trials if t.index == index]
        if not found:
            raise RunNotFoundError(f"sweep {self.name!r} has no trial {index}; it has {len(self.trials)}.")
        if self._handle is not None:
            ray.get(self._handle.stop_trial.remote(found[0].id), timeout=TRIAL_STOP_S)

    def dashboard(self) -> Any:
        """Show the sweep's live view and return it: every trial's curve, each hyperparameter against the
        metric, the trial table (stop a trial from there)."""
        from nbtrain._views.sweep_dashboard import show_sweep_dashboard

        return show_sweep_dashboard(self)


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
    options = SweepOptions(**arguments)
    return start_sweep(train_fn, options, run_options)


def start_sweep(train_fn: Any, options: SweepOptions, run_options: dict[str, Any]) -> Sweep:
    """``tune()`` once its options are validated (the magic calls this too)."""
    import ray

    from nbtrain._cluster.sweep.sweep_supervisor import SweepSupervisor, sweep_supervisor_options

    for key in run_options:
        if key in SET_BY_THE_SWEEP:
            instead = SET_BY_THE_SWEEP[key]
            msg = (f"{key} is set by the sweep for each trial" + (f"; use {instead}" if instead else "") +
                   ". Leave it out of tune().")
            raise InvalidOptionError(msg)
    _check_scheduler(options.scheduler)
    datasets = run_options.pop("datasets", None)
    try:
        run = with_uploaded_paths(RunOptions(**run_options, workers=options.workers_per_trial, datasets=datasets))
    except TypeError as exc:
        msg = f"tune() got an option it does not know: {exc}. Sweep options and run options are listed in " \
              f"help(nbtrain.tune) and help(nbtrain.launch)."
        raise InvalidOptionError(msg) from None
    asked = options.name or time.strftime("sweep-%Y%m%d-%H%M%S")
    cluster = connection.current()
    check_resources(options.workers_per_trial, run.cpus_per_worker, run.gpus_per_worker)
    takes_config = check_signature(train_fn)
    if not takes_config:
        msg = "A sweep's training function takes the config: def train(config): ... (the sampled values are in it)."
        raise InvalidOptionError(msg)
    fn_bytes, modules = dumps_checked(train_fn)
    trial_run = RunSpec(options=dataclasses.replace(run, datasets=None, config=dict(run.config or {})),
                        fn_bytes=fn_bytes, fn_takes_config=True, owner=owner(), modules=modules,
                        warm_pool=warm.pool_for(run))  # a trial's ranks: this notebook session's warm workers
    holds = packages_to_hold(run.runtime_env)
    for _ in range(NAME_TRIES):  # another sweep may take the name chosen before this one starts: choose again
        name = _free_sweep_name(asked, cluster.address)
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
    sweep = Sweep(name, handle, cluster.address)
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


def _live_sweep_names() -> list[str]:
    import ray

    return [actor["name"][len(sweep_actor_name("")):] for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor.get("namespace") == NAMESPACE and actor["name"].startswith(sweep_actor_name(""))]


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


def _find_handle(name: str) -> Any:
    import ray

    try:
        return ray.get_actor(sweep_actor_name(name), namespace=NAMESPACE)
    except ValueError:
        return None


def _stored_record(name: str) -> dict[str, Any]:
    from nbtrain._cluster.sweep.sweep_supervisor import read_sweep_record

    record = on_head(read_sweep_record, name)
    if record is None:
        raise RunNotFoundError(f"No sweep named {name!r} on the cluster. Sweeps there: "
                               f"{', '.join(stored_sweep_names()) or 'none'}.")
    return record  # type: ignore[no-any-return]


def stored_sweep_names() -> list[str]:
    from nbtrain._cluster.sweep.sweep_supervisor import stored_sweep_names as names

    return on_head(names)  # type: ignore[no-any-return]


def attach_sweep(name: str) -> Sweep:
    """The sweep ``name`` (from another kernel, or before a restart), with every trial's history.

    Args:
        name: the sweep's name, as ``sweeps()`` lists it.

    Returns:
        The :class:`Sweep`.

    Raises:
        RunNotFoundError: the connected cluster has no sweep of that name.
        NotConnectedError: no ``connect()`` first.

    Example::

        sweep = nbtrain.attach_sweep("lr-sweep"); sweep.dashboard()
    """
    cluster = connection.current()
    sweep = Sweep(name, _find_handle(name), cluster.address)
    sweep.refresh()
    return sweep


def sweeps() -> list[dict[str, Any]]:
    """Every sweep on the connected cluster: name, state, trials, metric, best value.

    Returns:
        One dict per sweep, with ``name``, ``state``, ``trials`` (how many), ``metric``, ``best``,
        ``started``, ``ended``.

    Raises:
        NotConnectedError: no ``connect()`` first.

    Example::

        [s["name"] for s in nbtrain.sweeps()]
    """
    connection.current()
    names = {*stored_sweep_names(), *_live_sweep_names()}
    listed = []
    for name in sorted(names):
        try:
            sweep = attach_sweep(name)
        except NbtrainError:
            continue
        best = sweep.best
        listed.append({"name": name, "state": sweep.cached.get("state"), "trials": len(sweep.cached["trials"]),
                       "metric": sweep.cached["metric"], "best": None if best is None else best.best,
                       "started": sweep.cached.get("started"), "ended": sweep.cached.get("ended")})
    return listed
