"""One trial of a sweep, as Ray Tune sees it: a class Trainable whose training is an nbtrain run.

Ray Tune reserves the trial's resources as a placement group (an empty head
bundle for this actor, one bundle per rank); :meth:`setup` starts an nbtrain run
whose ranks run in those bundles, so everything a run has (every rank's curves,
logs, failures, ``max_failures``, checkpoints) each trial has. One :meth:`step`
is one row of rank 0 that carries the sweep's metric: Tune's
``training_iteration`` counts rank 0's reports of the metric (the row's run,
attempt, step and time ride along under ``ROW_IDENTITY``, so the sweep's table
can leave out the rows a restart or a rewind of the run replaced). When the
scheduler stops the trial, :meth:`cleanup` stops the run and waits until its
ranks have left the bundles: Tune calls it through ``stop()``, or
:meth:`reset_config` does when Tune hands this process and its bundles to the
next trial.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import cloudpickle
import ray
from ray import tune

from nbtrain._cluster.command_kinds.table import command_kind
from nbtrain._cluster.names import NAMESPACE, sweep_actor_name, trial_run_name
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.sweep.trial_curve import ROW_IDENTITY
from nbtrain._paths import write_atomic
from nbtrain._ray_compat import on_head_node

POLL_WAIT_S = 5.0
END_GRACE_S = 10.0
STOP_WAIT_S = 60.0
ROW_KEYS = ("rank", "attempt", "time")
CHECKPOINT_FILE = "nbtrain-checkpoint.bin"  # a trial's checkpoint as Ray Tune keeps it: the run's bytes...
CHECKPOINT_META = "nbtrain-checkpoint.json"  # ...and their meta (step, attempt, format, the run it came from)
METRIC_LOOKAHEAD_ROWS = 20  # rank 0's rows seen without the metric before the sweep says it is never reported


class MetricNotReported(RuntimeError):
    """Rank 0 of a trial reports rows, but never the sweep's metric: every trial would do the same."""


class TrialRunFailed(RuntimeError):
    """The trial's nbtrain run failed; its message is the run's error (which rank, what it raised)."""


class NbtrainTrial(tune.Trainable):
    def setup(self, config: dict[str, Any], sweep_name: str = "") -> None:
        self._sweep_name = sweep_name
        self._sweep = ray.get_actor(sweep_actor_name(sweep_name), namespace=NAMESPACE)
        template: RunSpec = cloudpickle.loads(ray.get(self._sweep.trial_template.remote()))
        settings = ray.get(self._sweep.trial_settings.remote())
        self._metric: str = settings["metric"]
        self._time_attr: str = settings["time_attr"]
        self._max_t: float | None = settings["max_t"]
        self._budget_spent = False  # the scheduler's max_t reached: the run is expected to end by itself
        self.index = int(str(self.trial_id).rsplit("_", 1)[-1])
        self._first_run_name = trial_run_name(sweep_name, self.index)
        self.run_name = self._first_run_name
        options = dataclasses.replace(template.options, name=self.run_name,
                                      config={**(template.options.config or {}), **config})
        self._spec = dataclasses.replace(template, options=options,
                                         placement_group=ray.util.get_current_placement_group())
        self._run: Any = None  # the run's supervisor, started at the first step (after a restore, from its checkpoint)
        self._last_result: dict[str, Any] = {}  # the last result given to Tune (numbers), kept with checkpoints
        self._cursor = 0
        self._rows: collections.deque[dict[str, Any]] = collections.deque()
        self._rank0_rows = 0
        self._seen_keys: set[str] = set()
        self._ended: dict[str, Any] | None = None
        self._rewinds_noted: list[dict[str, Any]] = []  # the run's rewinds as the sweep's table has them

    def _start(self) -> None:
        """The trial's run, from the template the notebook checked as every run's spec is checked (see
        ``_client/launching/starting``). Its start differs where Tune decides: no resource check (Tune reserved
        the bundles), no numbered name (the sweep's name was; a trial's derives from it), the sweep's supervisor
        holds the uploaded folders, no registry record (the sweep is the user's handle), and no wait here:
        :meth:`step` polls the run, and a supervisor that could not start fails the trial there."""
        from nbtrain._cluster.supervisor.supervisor import spec_parts, supervisor_actor, supervisor_options

        # DEFAULT scheduling: the supervisor must outlive the trial's placement group, which Tune removes
        self._run = supervisor_actor().options(**supervisor_options(self.run_name),
                                                      scheduling_strategy="DEFAULT").remote(
            *spec_parts(cloudpickle.dumps(self._spec)), datasets=ray.get(self._sweep.trial_datasets.remote()))
        self._note(run=self.run_name, index=self.index)

    def step(self) -> dict[str, Any]:
        if self._run is None:
            self._start()
        while not self._rows:
            if self._ended is not None:
                return self._finish()
            self._read()
        row = self._rows.popleft()
        result = {key: value for key, value in row.items() if key not in ROW_KEYS}
        result[ROW_IDENTITY] = {"run": self.run_name, "attempt": row.get("attempt"), "step": row.get("step"),
                                "time": row.get("time")}
        spent = result.get(self._time_attr, self.iteration + 1 if self._time_attr == "training_iteration" else None)
        if self._max_t is not None and isinstance(spent, (int, float)) and spent >= self._max_t:
            self._budget_spent = True
        if not self._rows and self._ended is not None and self._ended["state"] == "succeeded":
            result["done"] = True
            self._note(ended_by_run=True)
        self._last_result = {key: value for key, value in result.items() if isinstance(value, (int, float))}
        return result

    def _note(self, **fields: Any) -> None:
        """Tell the sweep's table, and wait: Tune's callback for this trial's end must find it there."""
        ray.get(self._sweep.note_trial.remote(self.trial_id, **fields))

    def _read(self) -> None:
        try:
            answer = ray.get(self._run.poll.remote(self._cursor, 1 << 30, 1 << 30, 10_000, POLL_WAIT_S))
        except ray.exceptions.RayActorError:  # the run ended and its supervisor retired: its files answer
            from nbtrain._cluster.supervisor.stored_run import read_stored

            reader = ray.remote(read_stored).options(num_cpus=0, resources=on_head_node(),
                                                    scheduling_strategy="DEFAULT")  # not in the trial's group
            answer = ray.get(reader.remote(self.run_name, "poll", (self._cursor, 1 << 30, 1 << 30, 10_000), {}))
        self._cursor = answer["cursor"]
        rewinds = [change for change in answer.get("changes") or [] if command_kind(change["kind"]).goes_back]
        if rewinds != self._rewinds_noted:  # what the rows it gave Tune are judged by (sweep's trial_curve)
            ray.get(self._sweep.note_rewinds.remote(self.trial_id, self.run_name, rewinds))
            self._rewinds_noted = rewinds
        for row in answer["rows"]:
            if row.get("rank") != 0:
                continue
            self._rank0_rows += 1
            self._seen_keys.update(key for key in row if key not in ROW_KEYS)
            if self._metric in row:
                self._rows.append(row)
        if not self._rows and self._rank0_rows >= METRIC_LOOKAHEAD_ROWS and not self._metric_seen():
            self._metric_missing()
        if answer["state"] in ("succeeded", "failed", "stopped") and not answer.get("has_more"):
            self._ended = answer

    def _metric_seen(self) -> bool:
        return self._metric in self._seen_keys

    def _metric_missing(self) -> None:
        reported = ", ".join(sorted(self._seen_keys)) or "nothing"
        msg = (f"metric {self._metric!r} is never reported by rank 0 of trial {self.run_name!r}; it reported: "
               f"{reported}. Report it (nbtrain.report({self._metric}=...)) or pick one of those with metric=.")
        self._note(metric_missing=msg)
        raise MetricNotReported(msg)

    def _finish(self) -> dict[str, Any]:
        ended = self._ended or {}
        if ended.get("state") == "failed":
            self._note(ended_by_run=True, error=ended.get("error"))
            raise TrialRunFailed(f"trial run {self.run_name!r} failed: {ended.get('error')}")
        restored = self._spec.initial_checkpoint is not None
        if not self._metric_seen() and ended.get("state") == "succeeded":
            if not restored:
                self._metric_missing()
            # started from a copied checkpoint at the end of training: nothing was left to train, and this
            # new trial process has no result of its own for Tune to repeat: the copied one's last stands
            self._note(ended_by_run=True)
            return {**self._last_result, "done": True}
        self._note(ended_by_run=True)
        return {tune.result.RESULT_DUPLICATE: True}

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """This process takes the next trial (Tune reuses it: no process start and imports per trial).

        Tune keeps a trial's actor for the next one without calling :meth:`cleanup`, so the run of
        the trial it ended (a scheduler's cut) is stopped here, and its ranks leave the bundles,
        before the next trial's run is set up in them."""
        self.cleanup()
        NbtrainTrial.setup(self, new_config, self._sweep_name)  # not tune.with_parameters' setup(config)
        return True

    def cleanup(self) -> None:
        """Stop the run if it is still going; returns when its ranks have left Tune's bundles."""
        if self._ended is not None or self._run is None:
            return
        if self._budget_spent and self._ends_by_itself():
            return
        try:  # returns once the run's workers are gone and their bundles free
            ray.get(self._run.stop.remote(STOP_WAIT_S), timeout=STOP_WAIT_S + 5)
        except ray.exceptions.RayError:
            pass  # it ended and retired meanwhile

    def _ends_by_itself(self) -> bool:
        """A trial at max_t is done: give its run a few seconds to finish (and end succeeded) before stopping it."""
        deadline = time.monotonic() + END_GRACE_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                answer = ray.get(self._run.poll.remote(1 << 62, 1 << 62, 1 << 62, 1, min(left, POLL_WAIT_S)))
            except ray.exceptions.RayError:
                return True  # it ended and retired
            if answer["state"] in ("succeeded", "failed", "stopped"):
                return True
        return False

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """The run's latest checkpoint, for Population Based Training to start another trial from.

        What the ranks last saved (``nbtrain.save_checkpoint``): with PBT, save at least once
        every ``perturbation_interval`` reports of the metric, or the copy is older than that.
        """
        found = None if self._run is None else self._latest_checkpoint()
        if found is None:
            return
        meta, data = found
        # each file whole, the meta last: a save cut short (the trial's node lost) leaves no meta, and no checkpoint
        write_atomic(Path(checkpoint_dir, CHECKPOINT_FILE), data, durable=True)
        write_atomic(Path(checkpoint_dir, CHECKPOINT_META), json.dumps(
            {**meta, "from_run": self.run_name, "last_result": self._last_result}).encode("utf-8"), durable=True)

    def _latest_checkpoint(self) -> tuple[dict[str, Any], bytes] | None:
        from nbtrain._cluster.storage import storage_uri

        try:
            found = ray.get(self._run.latest_checkpoint.remote())
        except ray.exceptions.RayActorError:  # the run ended and its supervisor retired: its files answer
            from nbtrain._cluster.supervisor.stored_run import read_stored

            reader = ray.remote(read_stored).options(num_cpus=0, resources=on_head_node(),
                                                    scheduling_strategy="DEFAULT")  # not in the trial's group
            found = ray.get(reader.remote(self.run_name, "latest_checkpoint", (), {}))
        if found is None:
            return None
        meta, data, path = found
        return meta, data if data is not None else storage_uri.read_bytes(path)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Start this trial's next run from another trial's checkpoint (PBT's exploit), under a new name."""
        data_path, meta_path = Path(checkpoint_dir, CHECKPOINT_FILE), Path(checkpoint_dir, CHECKPOINT_META)
        if not meta_path.exists():
            return  # the other trial had not saved (whole) yet: start from scratch with the new config
        meta = json.loads(meta_path.read_text())
        self._last_result = meta.pop("last_result", {})
        self.run_name = f"{self._first_run_name}-i{self.iteration}"
        options = dataclasses.replace(self._spec.options, name=self.run_name)
        self._spec = dataclasses.replace(self._spec, options=options,
                                         initial_checkpoint=(meta, data_path.read_bytes()))
