"""Hyperparameter sweeps from the notebook: :class:`Sweep`, ``attach_sweep``, ``sweeps`` (``nbtrain.tune()`` starts
one: :mod:`nbtrain._client.entry.sweep_start`).

A sweep runs Ray Tune on the cluster (see :mod:`nbtrain._cluster.sweep.sweep_supervisor`);
each trial is an nbtrain run named ``<sweep>-t<N>``. The notebook only reads the
sweep's trial table (one long poll for all trials) and, for a trial it looks
into, that trial's run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from nbtrain._client import views
from nbtrain._client.connecting import connection
from nbtrain._client.connecting.head_tasks import on_head
from nbtrain._client.entry.launch import attach
from nbtrain._client.kernel.widget_messages import widget_messages_served
from nbtrain._client.run.following import POLL_WHILE_SERVING_S
from nbtrain._client.run.handle import Run
from nbtrain._cluster.names import NAMESPACE, sweep_actor_name
from nbtrain._exceptions import NbtrainError, RunNotFoundError, SweepFailedError

POLL_TIMEOUT_S = 30.0
TRIAL_STOP_S = 70.0  # the sweep's supervisor gives a trial's run 60 s to stop
TERMINAL = ("succeeded", "failed", "stopped")
# Run options a sweep sets itself for each trial: given to tune(), they would mean something else.
SET_BY_THE_SWEEP = {"workers": "workers_per_trial", "name": "name (the sweep's; trial N's run is <name>-t<N>)",
                    "wait": "wait (the sweep's)", "resume": None}


@dataclasses.dataclass
class Trial:
    """One trial as the sweep's table had it when read (:attr:`Sweep.trials`, :attr:`Sweep.best`): ``config``
    (the sampled values), ``state``, ``iterations`` (rank 0's reports of the metric), ``last`` and ``best``
    (its values), ``stop_reason``, ``error``, ``waiting_for`` (a pending trial's missing resources), ``curve``
    (``(iteration, value)`` pairs). ``curve``, ``last`` and ``best`` are of the rows that still count in the trial's
    run: a restart or a rewind that went back over reported steps leaves those iterations out (``iterations`` still
    counts them, as Tune did). Example: ``sweep.best.run.load_checkpoint()``.
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
        with widget_messages_served() as serve_widgets:  # the sweep's dashboard, shown above, acts meanwhile
            poll_s = 5.0 if serve_widgets is None else POLL_WHILE_SERVING_S
            while answer.get("state") not in TERMINAL:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    msg = f"sweep {self.name!r} is still {answer.get('state')} after {timeout:g} s"
                    raise TimeoutError(msg)
                if serve_widgets is not None:
                    serve_widgets()
                answer = self.refresh(wait_s=min(left or poll_s, poll_s))
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

    def figure(self, best: int = 3) -> Any:
        """The ``best`` trials' curves of the sweep's metric as one plotly figure (each trial's run, its mean across
        ranks), best first, failed trials left out: as ``nbtrain.compare(...).figure()`` draws runs.

        Args:
            best: how many trials, by their best value of the metric (the sweep's ``mode``).

        Returns:
            A ``plotly.graph_objects.Figure`` (no trial reported yet: an empty one whose title says so).

        Raises:
            InvalidOptionError: ``best`` is not a whole number >= 1.

        Example::

            sweep.figure(best=5).write_html("best-trials.html")
        """
        return views.open_view(views.SWEEP_FIGURE, self, best)

    def dashboard(self) -> Any:
        """Show the sweep's live view and return it: every trial's curve, each hyperparameter against the
        metric, the trial table (stop a trial from there)."""
        return views.open_view(views.SWEEP_DASHBOARD, self)


def _live_sweep_names() -> list[str]:
    import ray

    return [actor["name"][len(sweep_actor_name("")):] for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor.get("namespace") == NAMESPACE and actor["name"].startswith(sweep_actor_name(""))]


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
