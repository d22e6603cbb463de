"""A sweep's supervisor: a detached actor on the head node that runs Ray Tune's ``Tuner`` there.

The sweep belongs to the cluster, as a run does: it goes on when the kernel
restarts or the notebook disconnects, and ``attach_sweep`` finds it by name.
Ray Tune does the searching and scheduling (its spaces, schedulers, search
algorithms); each trial is an nbtrain run started by
:class:`~nbtrain._cluster.sweep.tune_trial.NbtrainTrial`. This actor keeps the trial
table the notebook reads (config, state, the metric per iteration, why a trial
stopped) from Tune's callbacks and from the trials themselves, answers long
polls on it, and when Tune is done writes the table to
``<sweeps_dir>/<name>/sweep.json`` and exits: a finished sweep holds no process.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import cloudpickle
import ray
from ray import tune
from ray.tune.stopper import Stopper

from nbtrain import _json
from nbtrain._cluster.names import NAMESPACE, find_supervisor, sweep_actor_name
from nbtrain._cluster.priority import lower_own_priority
from nbtrain._cluster.spec import SweepSpec, summarize_config
from nbtrain._cluster.sweep.trial_curve import ROW_IDENTITY, TrialCurve
from nbtrain._paths import private_dir, sweeps_dir, write_json_atomic
from nbtrain._ray_compat import on_head_node
from nbtrain._sweep_options import pbt_mutations

SWEEP_RECORD = "sweep.json"
LONG_POLL_LIMIT_S = 10.0
TRIAL_STOP_WAIT_S = 60.0  # a trial's run, stopped at the end of the sweep: until its workers are gone
TRIAL_STATES = ("pending", "running", "succeeded", "stopped", "failed")


def sweep_supervisor_options(sweep_name: str, holds: dict[str, Any] | None = None) -> dict[str, Any]:
    """``holds``: the trials' uploaded folders, kept on the cluster while the sweep lives (see supervisor_options)."""
    return {"name": sweep_actor_name(sweep_name), "namespace": NAMESPACE, "lifetime": "detached",
            "max_restarts": 0, "max_concurrency": 64, "num_cpus": 0,
            "resources": on_head_node(), **({"runtime_env": holds} if holds else {})}


def search_algorithm(options: Any) -> Any:
    """``search_alg=`` as given, or with ``seed=`` Ray Tune's default search drawing from that seed."""
    if options.seed is None:
        return options.search_alg
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=options.seed)


def make_scheduler(options: Any) -> Any:
    """``scheduler=`` as a Ray Tune scheduler object (a name picks one with the sweep's knobs)."""
    from ray.tune.schedulers import ASHAScheduler, AsyncHyperBandScheduler, FIFOScheduler, PopulationBasedTraining

    if options.scheduler in (None, "fifo"):
        return FIFOScheduler()
    if options.scheduler == "asha":
        return ASHAScheduler(time_attr=options.time_attr, max_t=options.max_t, grace_period=options.grace_period,
                             reduction_factor=options.reduction_factor)
    if options.scheduler == "pbt":
        return PopulationBasedTraining(time_attr=options.time_attr, perturbation_interval=options.perturbation_interval,
                                       hyperparam_mutations=pbt_mutations(options.space))
    if options.scheduler == "hyperband":  # the asynchronous one: it stops trials, never pauses them
        return AsyncHyperBandScheduler(time_attr=options.time_attr, max_t=options.max_t,
                                       grace_period=options.grace_period,
                                       reduction_factor=options.reduction_factor, brackets=3)
    return options.scheduler


def asha_rung(options: Any, iteration: float) -> int | None:
    """The ASHA rung (0 = the grace period) a trial stopped at, for ``scheduler="asha"``."""
    if options.scheduler != "asha":
        return None
    milestone, rung = options.grace_period, 0
    while milestone * options.reduction_factor <= iteration + 1e-9:
        milestone *= options.reduction_factor
        rung += 1
    return rung


# The supervisor of each sweep in this process, by name. Ray Tune pickles its callbacks and stopper
# with the experiment's state, so they hold a sweep's name and find its (unpicklable) supervisor here.
_SUPERVISORS: dict[str, SweepSupervisor] = {}


class _Stops(Stopper):
    """The notebook's stop buttons, as Ray Tune hears them: the sweep, or one trial."""

    def __init__(self, sweep_name: str) -> None:
        self._name = sweep_name

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return trial_id in _SUPERVISORS[self._name].stop_requests

    def stop_all(self) -> bool:
        return _SUPERVISORS[self._name].stop_everything.is_set()


class _TrialBook(tune.Callback):
    def __init__(self, sweep_name: str) -> None:
        self._name = sweep_name

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        _SUPERVISORS[self._name].saw_trials(trials)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        _SUPERVISORS[self._name].saw_result(trial, result)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        _SUPERVISORS[self._name].saw_end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        _SUPERVISORS[self._name].saw_end(trial, failed=True)


class SweepSupervisor:
    def __init__(self, spec_bytes: bytes, datasets: dict[str, Any] | None = None) -> None:
        lower_own_priority()
        self.spec: SweepSpec = cloudpickle.loads(spec_bytes)
        self._datasets = datasets
        self._dir = private_dir(sweeps_dir() / self.spec.name)
        self._lock = threading.Condition()
        self._version = 0
        self._trials: dict[str, dict[str, Any]] = {}
        self._curves: dict[str, TrialCurve] = {}  # by trial id: Tune's points of the metric, and which count
        self.stop_everything = threading.Event()
        self.stop_requests: set[str] = set()  # trial ids
        self._state = "running"
        self._error: str | None = None
        self._started = time.time()
        self._ended: float | None = None
        self._scheduler: Any = None
        self._handle = ray.get_runtime_context().current_actor
        _SUPERVISORS[self.spec.name] = self
        threading.Thread(target=self._fit, name="nbtrain-sweep", daemon=True).start()

    # ------------------------------------------------------------------ Ray Tune, on its own thread
    def _fit(self) -> None:
        try:
            self._tuner().fit()
            state = "stopped" if self.stop_everything.is_set() else "succeeded"
        except Exception as exc:  # noqa: BLE001 - the sweep fails with Tune's reason; the notebook shows it
            state, self._error = "failed", f"{type(exc).__name__}: {exc}"
        self._stop_unfinished_runs()
        with self._lock:
            missing = next((t["error"] for t in self._trials.values() if t.get("metric_missing")), None)
            if missing is not None:
                state, self._error = "failed", missing
            for record in self._trials.values():
                if record["state"] in ("pending", "running"):  # never started, or Tune ended without a word
                    record["state"] = "stopped"
                    record["stop_reason"] = record["stop_reason"] or f"the sweep ended ({state}) first"
                    record["waiting_for"] = None
            self._state, self._ended = state, time.time()
            self._changed()
        self._retire()

    def _stop_unfinished_runs(self) -> None:
        """Stop the runs of trials Tune ended without a word, before the sweep says it ended.

        When the sweep stops, Tune ends a trial whose actor is still inside its first ``step()``
        (its run starting, no row yet) by killing the actor: its ``cleanup()`` never runs, and the
        run's detached supervisor would go on with nobody to stop it.
        """
        with self._lock:
            runs = [t["run"] for t in self._trials.values() if t["state"] in ("pending", "running") and t.get("run")]
        supervisors = [s for s in map(find_supervisor, runs) if s is not None]  # None: its run has ended already
        stops = [supervisor.stop.remote(TRIAL_STOP_WAIT_S) for supervisor in supervisors]
        try:
            ray.get(stops, timeout=TRIAL_STOP_WAIT_S + 5)
        except ray.exceptions.RayError:
            pass  # a run that ended meanwhile (its supervisor retired); one still stopping has been told

    def _tuner(self) -> Any:
        from ray.tune import PlacementGroupFactory

        from nbtrain._cluster.sweep.tune_trial import NbtrainTrial

        options = self.spec.options
        run = self.spec.trial_run.options
        self._scheduler = make_scheduler(options)
        bundle = {"CPU": float(run.cpus_per_worker), **({"GPU": float(run.gpus_per_worker)}
                                                         if run.gpus_per_worker else {})}
        trainable = tune.with_resources(
            tune.with_parameters(NbtrainTrial, sweep_name=self.spec.name),
            PlacementGroupFactory([{}] + [bundle] * options.workers_per_trial, strategy=run.placement_strategy))
        return tune.Tuner(
            trainable, param_space=dict(options.space),
            tune_config=tune.TuneConfig(metric=options.metric, mode=options.mode, num_samples=options.num_samples,
                                        scheduler=self._scheduler, search_alg=search_algorithm(options),
                                        max_concurrent_trials=options.max_concurrent, reuse_actors=True),
            run_config=tune.RunConfig(name="tune", storage_path=str(self._dir), stop=_Stops(self.spec.name),
                                      verbose=0, callbacks=[_TrialBook(self.spec.name)],
                                      failure_config=tune.FailureConfig(max_failures=0)))

    def _retire(self) -> None:
        write_json_atomic(self._dir / SWEEP_RECORD, self.poll(0, 0.0))
        ray.kill(self._handle, no_restart=True)

    # ------------------------------------------------------------------ the trial table
    def _trial(self, trial_id: str) -> dict[str, Any]:
        found = self._trials.get(trial_id)
        if found is None:
            found = self._trials[trial_id] = {
                "id": trial_id, "index": int(trial_id.rsplit("_", 1)[-1]), "run": None, "config": {},
                "state": "pending", "iterations": 0, "stop_reason": None, "error": None, "waiting_for": None}
            self._curves[trial_id] = TrialCurve()
        return found

    def _changed(self) -> None:
        self._version += 1
        self._lock.notify_all()

    def saw_trials(self, trials: list[Any]) -> None:
        run = self.spec.trial_run.options
        needs = f"{self.spec.options.workers_per_trial * run.cpus_per_worker:g} CPU" + (
            f" and {self.spec.options.workers_per_trial * run.gpus_per_worker:g} GPU" if run.gpus_per_worker else "")
        with self._lock:
            changed = False
            for trial in trials:
                record = self._trial(trial.trial_id)
                config = _plain(dict(trial.config))
                if record["config"] != config:  # new, or changed by PBT's exploit
                    record["config"] = config
                    changed = True
                if trial.status == "PENDING" and record["state"] == "pending" and record["waiting_for"] is None:
                    record["waiting_for"] = needs
                    changed = True
                elif trial.status == "RUNNING" and record["state"] == "pending":
                    record["state"], record["waiting_for"] = "running", None
                    changed = True
            if changed:
                self._changed()

    def saw_result(self, trial: Any, result: dict[str, Any]) -> None:
        metric = self.spec.options.metric
        with self._lock:
            record = self._trial(trial.trial_id)
            record["state"], record["waiting_for"] = "running", None
            if metric in result:
                record["iterations"] = int(result.get("training_iteration", record["iterations"] + 1))
                self._curves[trial.trial_id].add(record["iterations"], float(result[metric]), result.get(ROW_IDENTITY))
                if self.spec.options.time_attr in result:
                    record["time_attr"] = result[self.spec.options.time_attr]
            self._changed()

    def saw_end(self, trial: Any, failed: bool) -> None:
        with self._lock:
            record = self._trial(trial.trial_id)
            if failed:
                record["state"] = "failed"
                record["error"] = record.get("error") or record.get("metric_missing") or _error_text(trial)
            elif self.stop_everything.is_set() or trial.trial_id in self.stop_requests:
                record["state"], record["stop_reason"] = "stopped", self._stop_reason(trial.trial_id, record)
            elif record.get("ended_by_run"):
                record["state"] = "succeeded"
            elif self._reached_max_t(record):
                record["state"], record["stop_reason"] = "succeeded", f"reached max_t ({self.spec.options.max_t})"
            else:
                record["state"] = "stopped"
                record["stop_reason"] = self._stop_reason(trial.trial_id, record)
            self._changed()

    def _reached_max_t(self, record: dict[str, Any]) -> bool:
        """Stopped by a scheduler for having run its full budget: done, not cut short."""
        max_t = self.trial_settings()["max_t"]
        at = record.get("time_attr", record["iterations"])
        return max_t is not None and isinstance(at, (int, float)) and at >= max_t

    def _stop_reason(self, trial_id: str, record: dict[str, Any]) -> str:
        if self.stop_everything.is_set():
            return "the sweep was stopped"
        if trial_id in self.stop_requests:
            return "stopped from the notebook"
        scheduler = self.spec.options.scheduler
        name = {"asha": "ASHA", "hyperband": "HyperBand", "pbt": "PBT"}.get(scheduler) if isinstance(scheduler, str) \
            else type(scheduler).__name__
        at = record.get("time_attr", record["iterations"])
        rung = asha_rung(self.spec.options, float(at))
        where = f"at rung {rung} ({self.spec.options.time_attr} {at})" if rung is not None \
            else f"at {self.spec.options.time_attr} {at}"
        return f"stopped by {name or 'the scheduler'} {where}"

    # ------------------------------------------------------------------ called by the trials
    def trial_template(self) -> bytes:
        return cloudpickle.dumps(self.spec.trial_run)  # type: ignore[no-any-return]

    def trial_datasets(self) -> dict[str, Any] | None:
        return self._datasets

    def trial_settings(self) -> dict[str, Any]:
        """What a trial needs of the sweep: the metric, what counts time, and the scheduler's budget."""
        options = self.spec.options
        scheduler = self._scheduler if self._scheduler is not None else make_scheduler(options)
        max_t = getattr(scheduler, "_max_t", getattr(scheduler, "_max_t_attr", None))
        return {"metric": options.metric, "time_attr": options.time_attr, "max_t": max_t}

    def note_trial(self, trial_id: str, **fields: Any) -> None:
        with self._lock:
            record = self._trial(trial_id)
            if "metric_missing" in fields:
                fields["error"] = fields["metric_missing"]
                self.stop_everything.set()  # every trial would miss it: end the sweep with that reason
            record.update(fields)
            self._changed()

    def note_rewinds(self, trial_id: str, run: str, commands: list[dict[str, Any]]) -> None:
        """The rewinds a trial's run records now (its points past the step a rewind went back to leave its curve)."""
        with self._lock:
            self._trial(trial_id)
            self._curves[trial_id].note_rewinds(run, commands)
            self._changed()

    # ------------------------------------------------------------------ notebook-facing
    def poll(self, version: int = 0, wait_s: float = 0.0) -> dict[str, Any]:
        """The sweep and its trial table; with ``wait_s`` a long poll that answers when it changed."""
        with self._lock:
            deadline = time.monotonic() + min(wait_s, LONG_POLL_LIMIT_S)
            while self._version <= version and self._state == "running" \
                    and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(timeout=left)
            options = self.spec.options
            return {
                "name": self.spec.name, "state": self._state, "error": self._error, "version": self._version,
                "metric": options.metric, "mode": options.mode, "time_attr": options.time_attr,
                "scheduler": options.scheduler if isinstance(options.scheduler, (str, type(None)))
                else type(options.scheduler).__name__,
                "knobs": {"max_t": options.max_t, "grace_period": options.grace_period,
                          "reduction_factor": options.reduction_factor},
                "num_samples": options.num_samples, "workers_per_trial": options.workers_per_trial,
                "space": {key: _describe(value) for key, value in options.space.items()},
                "base_config": summarize_config(self.spec.trial_run.options.config or {}),
                "started": self._started, "ended": self._ended, "now": time.time(), "owner": self.spec.owner,
                "trials": sorted((self._with_curve(t) for t in self._trials.values()), key=lambda t: t["index"]),
            }

    def _with_curve(self, record: dict[str, Any]) -> dict[str, Any]:
        """A trial's row of the table with its curve (and where its line breaks), last and best value: of the points
        that still count in its run (:mod:`.trial_curve`)."""
        curve = self._curves[record["id"]]
        return {**record, "curve": curve.points(), "breaks": curve.breaks(), "last": curve.last(),
                "best": curve.best(self.spec.options.mode)}

    def stop(self, timeout: float = 60.0) -> str:
        """Stop every trial and end the sweep; returns its state once Tune has stopped (or ``timeout``)."""
        self.stop_everything.set()
        with self._lock:
            deadline = time.monotonic() + timeout
            while self._state == "running" and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(timeout=left)
            return self._state

    def stop_trial(self, trial_id: str) -> None:
        """Stop one trial now: Tune's stopper agrees, and its run is stopped (its trial then ends).

        Returns once the run's workers are gone, as ``run.stop()`` does: a trial the sweep's table
        then shows as stopped never has a run still going.
        """
        with self._lock:
            self.stop_requests.add(trial_id)
            run = self._trials.get(trial_id, {}).get("run")
        supervisor = find_supervisor(run) if run is not None else None
        if supervisor is not None:  # None: its run has ended already
            try:
                ray.get(supervisor.stop.remote(TRIAL_STOP_WAIT_S), timeout=TRIAL_STOP_WAIT_S + 5)
            except ray.exceptions.RayError:
                pass  # it ended and retired meanwhile


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    return {key: value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)
            for key, value in config.items()}


def _describe(value: Any) -> str:
    """A search-space entry in a few words: ``loguniform(0.0001, 0.1)``, ``grid [0.01, 0.1]``, or the value."""
    if isinstance(value, dict) and "grid_search" in value:
        return f"grid {value['grid_search']!r}"
    domain = type(value).__name__
    sampler = getattr(value, "sampler", None)
    if hasattr(value, "lower") and hasattr(value, "upper"):
        kind = "loguniform" if "LogUniform" in type(sampler).__name__ else domain.lower()
        return f"{kind}({value.lower:g}, {value.upper:g})"
    if hasattr(value, "categories"):
        return f"choice {list(value.categories)!r}"
    return repr(value)


def _error_text(trial: Any) -> str:
    """The last line of the trial's error as Ray Tune kept it (its error file)."""
    path = getattr(trial, "error_file", None) or ""
    try:
        with open(path) as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
    except OSError:
        return "the trial failed (Ray Tune kept no error text)"
    return lines[-1] if lines else "the trial failed"


def read_sweep_record(name: str) -> dict[str, Any] | None:
    """A finished sweep's table (in a task on the head node); None if there is none."""
    path = sweeps_dir() / name / SWEEP_RECORD
    return _json.loads(path.read_text()) if path.exists() else None


def stored_sweep_names() -> list[str]:
    root = sweeps_dir()
    return sorted(p.parent.name for p in root.glob(f"*/{SWEEP_RECORD}")) if root.exists() else []
