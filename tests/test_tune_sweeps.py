"""nbtrain.tune(): real Ray Tune on the loopback cluster, each trial a 2-rank nbtrain run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from io import StringIO

import pytest
from ray import tune

import nbtrain

from _helpers import ipython_shell, wait_for

BEST_Q = 0.1
FAILING_Q = 7.0


def quality_run(config):
    """loss = q + 1/step: a smaller q is a better trial at every step; q = FAILING_Q makes rank 1 raise."""
    import time as _time

    import torch.distributed as dist

    if config["q"] == FAILING_Q and nbtrain.get_context().rank == 1:
        raise ValueError("rank 1 refuses this q")
    dist.barrier()  # rank 0 reports nothing when rank 1 fails: no scheduler can stop that trial first
    for step in range(1, config["steps"] + 1):
        nbtrain.report(step=step, loss=config["q"] + 1.0 / step)
        _time.sleep(config["pause"])


def test_asha_stops_bad_trials_early_and_best_is_the_known_best(cluster):
    grid = [BEST_Q, 5.0, 0.2, 4.0, FAILING_Q]
    sweep = nbtrain.tune(quality_run, space={"q": tune.grid_search(grid)}, config={"steps": 8, "pause": 0.25},
                         metric="loss", mode="min", scheduler="asha", max_t=8, grace_period=1, reduction_factor=2,
                         workers_per_trial=2, name="asha-sweep", max_concurrent=2)
    assert sweep.wait(timeout=600) == "succeeded"
    trials = sweep.trials
    assert sorted(t.config["q"] for t in trials) == sorted(grid)
    best = sweep.best
    assert best is not None and best.config["q"] == BEST_Q
    assert best.state == "succeeded" and best.iterations == 8
    assert best.run.state == nbtrain.RunState.SUCCEEDED, "a trial at max_t lets its run finish"
    stopped = [t for t in trials if t.state == "stopped"]
    assert any(t.config["q"] >= 3.0 for t in stopped), [(t.config, t.state, t.iterations) for t in trials]
    for trial in stopped:  # ASHA keeps the best half at each rung: only trials worse than the best are cut
        assert trial.config["q"] > BEST_Q, f"the best trial was stopped: {trial}"
        assert trial.iterations < 8 and trial.stop_reason.startswith("stopped by ASHA at rung")
    [failed] = [t for t in trials if t.state == "failed"]
    assert failed.config["q"] == FAILING_Q
    assert "rank 1" in failed.error.lower() and "refuses this q" in failed.error
    # each trial is a whole nbtrain run: both ranks' rows are there
    rows = best.run.metrics
    assert {r["rank"] for r in rows} == {0, 1} and max(r["step"] for r in rows) == 8
    frame = sweep.results_frame()
    assert list(frame["q"].sort_values()) == sorted(grid) and "best_loss" in frame
    assert {"name": "asha-sweep", "state": "succeeded"}.items() <= next(
        s for s in nbtrain.sweeps() if s["name"] == "asha-sweep").items()
    printed = StringIO()
    with redirect_stdout(printed):
        ipython_shell().run_line_magic("ray_status", "")
    assert f"sweep asha-sweep: succeeded, 5 trials, best loss {BEST_Q + 1 / 8:.4g}" in printed.getvalue()


def test_a_trial_whose_run_restarts_draws_only_the_rows_that_count_in_its_run(cluster):
    """Rank 1 raises at step 5 of attempt 1; attempt 2 resumes from the latest checkpoint. Tune counts every row
    rank 0 reported; the sweep's curve (what its dashboard draws) keeps the rows the run's history keeps."""
    from _train_fns import train_steps

    sweep = nbtrain.tune(train_steps, space={"sleep": tune.grid_search([0.05])},
                         config={"steps": 8, "checkpoint_every": 3, "fail_rank": 1, "fail_step": 5},
                         metric="loss", mode="min", workers_per_trial=2, max_failures=1, name="restarting-sweep")
    assert sweep.wait(timeout=300) == "succeeded"
    [trial] = sweep.trials
    assert trial.run.attempt == 2, "the trial's run restarted once"
    drawn_steps = [round(1 / value) - 1 for _iteration, value in trial.curve]  # train_steps' loss is 1/(step+1)
    assert drawn_steps == list(range(8)), f"each step once, on the branch the run went on with: {trial.curve}"
    assert trial.iterations > len(trial.curve), "Tune counted the rows the restart replaced; the curve leaves them"
    assert trial.best == pytest.approx(1 / 8) and trial.last == pytest.approx(1 / 8)


def test_a_metric_never_reported_fails_the_sweep_naming_it(cluster):
    def reports_accuracy(config):
        for step in range(3):
            nbtrain.report(acc=0.5 + step * config["x"])

    sweep = nbtrain.tune(reports_accuracy, space={"x": tune.uniform(0.0, 0.1)}, metric="loss", mode="min",
                         num_samples=2, name="no-such-metric")
    with pytest.raises(nbtrain.SweepFailedError, match=r"metric 'loss' is never reported by rank 0.*acc"):
        sweep.wait(timeout=300)


def test_a_killed_kernel_leaves_the_sweep_going_and_attach_sweep_sees_every_trial(cluster):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import cloudpickle, test_tune_sweeps as here, nbtrain
        from ray import tune
        cloudpickle.register_pickle_by_value(here)
        nbtrain.connect({cluster.address!r}, progress=lambda m: None)
        sweep = nbtrain.tune(here.quality_run, space={{"q": tune.grid_search([0.3, 0.5])}},
                             config={{"steps": 4, "pause": 0.2}}, metric="loss", mode="min",
                             workers_per_trial=2, name="orphan-sweep")
        while not any(t.iterations for t in sweep.trials):
            sweep.refresh(wait_s=5)
        print("READY", flush=True)
        sys.stdin.read()
    """)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                              text=True)
    try:
        # the driver's stdout carries Ray's own lines too (a raylet's warnings reach its drivers)
        for line in iter(driver.stdout.readline, ""):
            if line.strip() == "READY":
                break
            print(line, end="")
        else:
            raise AssertionError("the sweep's driver ended before its first trial reported")
    finally:
        driver.kill()
        driver.wait()
    sweep = nbtrain.attach_sweep("orphan-sweep")
    assert sweep.wait(timeout=300) == "succeeded"
    assert sorted(t.config["q"] for t in sweep.trials) == [0.3, 0.5]
    assert all(t.state == "succeeded" and t.iterations == 4 for t in sweep.trials), sweep.trials
    assert sweep.best.config["q"] == 0.3
    wait_for(lambda: not any(a["name"] == "nbtrain-sweep:orphan-sweep" for a in _named_actors()), 30,
             message="a finished sweep to hold no process")


def _named_actors():
    import ray

    return ray.util.list_named_actors(all_namespaces=True)


def test_stopping_a_trial_and_the_sweep_from_the_notebook_frees_their_runs(cluster):
    sweep = nbtrain.tune(quality_run, space={"q": tune.grid_search([0.5, 0.6, 0.7])},
                         config={"steps": 400, "pause": 0.1}, metric="loss", mode="min", workers_per_trial=1,
                         max_concurrent=2, name="stopped-sweep")
    first = wait_for(lambda: next((t for t in sweep.trials if t.iterations >= 2), None), 120,
                     message="a trial's second report")
    held = first.run.pause(wait=True)  # a trial is a run: it is steered as one
    first.run.resume()
    assert (first.run.changes[0]["kind"], first.run.changes[0]["step"]) == ("pause", held)
    first.stop()
    stopped = wait_for(lambda: next((t for t in sweep.trials if t.index == first.index and t.state == "stopped"),
                                    None), 20, message="the trial to stop")
    assert stopped.stop_reason == "stopped from the notebook"
    assert stopped.run.state == nbtrain.RunState.STOPPED
    assert sweep.stop() == "stopped"
    assert all(t.state == "stopped" for t in sweep.trials), sweep.trials
    for trial in sweep.trials:
        if trial.run_name is not None:
            assert trial.run.state == nbtrain.RunState.STOPPED, trial


def test_every_trial_gets_its_shards_of_the_sweeps_ray_dataset(cluster):
    import numpy as np
    import ray

    def count_rows(config):
        seen = [int(x) for batch in nbtrain.get_dataset_shard("train").iter_torch_batches(batch_size=8)
                for x in batch["data"]]
        nbtrain.report(loss=config["q"], rows=len(seen))
        return sorted(seen)

    dataset = ray.data.from_numpy(np.arange(32))
    sweep = nbtrain.tune(count_rows, space={"q": tune.grid_search([1.0, 2.0])}, metric="loss", mode="min",
                         workers_per_trial=2, datasets={"train": dataset}, name="dataset-sweep", max_concurrent=1)
    assert sweep.wait(timeout=300) == "succeeded"
    for trial in sweep.trials:
        rank0, rank1 = trial.run.result
        assert len(rank0) == len(rank1) == 16 and sorted(rank0 + rank1) == list(range(32)), trial
    # the second trial's ranks are the processes the first one left: this session's warm workers
    first, second = sorted(sweep.trials, key=lambda t: t.index)
    assert {w["pid"] for w in second.run.workers} == {w["pid"] for w in first.run.workers}


PACER = "pbt-pacer"
PACER_NAMESPACE = "nbtrain-tests"


def descend(config):
    """x <- x - lr·2x from x = 10, a checkpoint at every step: a larger lr (up to 0.5) is better at every step,
    and lr = 0 never moves (loss 100 at every step).

    Each step waits until the test's pacer lets this run report it (a run started from another's checkpoint
    waits only for the last release): PBT decides from the order Tune sees the trials' results in, and the
    test, not the machine's load, sets that order.
    """
    import ray

    pacer = ray.get_actor(PACER, namespace=PACER_NAMESPACE)
    saved = nbtrain.load_checkpoint()
    x, start = (saved["x"], saved["step"]) if saved else (10.0, 0)
    key = config["lr"] if start == 0 else None
    for step in range(start + 1, config["steps"] + 1):
        ray.get(pacer.wait.remote(key, step, timeout=120.0))
        x -= config["lr"] * 2 * x
        nbtrain.report(step=step, loss=x * x, resumed_from=start)
        nbtrain.save_checkpoint({"x": x, "step": step})  # after the report: the checkpoint's step is this one


def test_pbt_restarts_weak_trials_from_a_strong_trials_checkpoint_with_a_perturbed_config(cluster):
    import asyncio

    import ray
    from ray.tune.search.basic_variant import BasicVariantGenerator

    @ray.remote(num_cpus=0)
    class Pacer:
        """A run of the trial with `key` reports a step once the test released it (for that key or for all)."""

        def __init__(self) -> None:
            self.released: dict = {}
            self.everyone = 0
            self.changed = asyncio.Condition()

        async def wait(self, key, step: int, timeout: float) -> None:
            async with self.changed:
                await asyncio.wait_for(self.changed.wait_for(
                    lambda: step <= max(self.released.get(key, 0), self.everyone)), timeout)

        async def release(self, key, step: int) -> None:
            async with self.changed:
                if key is None:
                    self.everyone = step
                else:
                    self.released[key] = step
                self.changed.notify_all()

    pacer = Pacer.options(name=PACER, namespace=PACER_NAMESPACE).remote()
    # PBT scores a trial at its perturbation points (steps 3 and 6 of 8), against the last scores of the
    # trials not finished; its bottom quarter (rounded up: one of three) copies its top quarter's checkpoint,
    # which a top trial saves only when it was on top at its own point. The test lets each trial reach a
    # point in turn and waits until Tune has seen it there: strong (lr 0.3), middle, weak (lr 0). At step 3
    # the strong trial is scored alone (no checkpoint), so nobody copies; at step 6 it is on top and saves,
    # and the weak trial, at the bottom, copies it. The weak one may train on to the end meanwhile: a trial
    # PBT pauses is stopped, which a run waiting on the pacer would make slow
    points = [{"lr": 0.3}, {"lr": 0.0}, {"lr": 0.001}]
    turns = [(0.3, 3, 3), (0.001, 3, 3), (0.0, 3, 3), (0.3, 6, 6), (0.001, 6, 6), (0.0, 8, 6)]

    def seen_at(lr: float, step: int) -> bool:
        index = points.index({"lr": lr})
        trial = next((t for t in sweep.refresh(wait_s=1.0)["trials"] if t["index"] == index), None)
        return trial is not None and (trial["iterations"] >= step or trial["run"] not in (None, f"pbt-sweep-t{index}"))

    try:
        sweep = nbtrain.tune(descend, space={"lr": tune.choice([0.0, 0.001, 0.3])}, config={"steps": 8},
                             metric="loss", mode="min", scheduler="pbt", perturbation_interval=3, num_samples=3,
                             search_alg=BasicVariantGenerator(points_to_evaluate=points),
                             workers_per_trial=1, name="pbt-sweep", max_concurrent=3)
        for lr, released, point in turns:
            ray.get(pacer.release.remote(lr, released))
            wait_for(lambda lr=lr, point=point: seen_at(lr, point), timeout=120,
                     message=f"Tune to see the trial with lr {lr} at step {point}", describe=lambda: sweep.cached)
        ray.get(pacer.release.remote(None, 8))
        assert sweep.wait(timeout=600) == "succeeded", sweep.error
    finally:
        ray.kill(pacer)
    restarted = [t for t in sweep.trials if t.run.name != f"pbt-sweep-t{t.index}"]
    assert [t.index for t in restarted] == [1], [(t.config, t.run.name) for t in sweep.trials]  # the weak one
    for trial in restarted:
        rows = sorted(trial.run.metrics, key=lambda row: row["step"])
        assert rows, ("restarted at step 6 of 8, it trains on", trial.state, trial.error, trial.run.events)
        resumed = rows[0]["resumed_from"]
        assert resumed > 0 and rows[0]["step"] == resumed + 1, "the new run continued from the copied checkpoint"
        [said] = [e["message"] for e in trial.run.events if e["message"].startswith("starting from the checkpoint")]
        donor = said.split("of run ")[1].split(" at step")[0]
        assert said.endswith(f"at step {resumed}") and donor != trial.run.name, (
            said, [(r["attempt"], r["step"], r["resumed_from"]) for r in rows], trial.run.events)
        # its first step is one step of the new config's lr from the donor's x at that step
        donor_rows = [r for r in nbtrain.attach(donor).metrics if r["step"] == resumed]
        assert len(donor_rows) == 1, (donor, resumed, donor_rows)
        [donor_row] = donor_rows
        expected = donor_row["loss"] * (1 - 2 * trial.run.config["lr"]) ** 2
        assert rows[0]["loss"] == pytest.approx(expected, rel=1e-9)
        assert trial.config["lr"] == trial.run.config["lr"], "the trial table shows the config PBT gave it"
    assert sweep.best is not None, [(t.index, t.state, t.best, t.iterations, t.config) for t in sweep.trials]
    assert sweep.best.config["lr"] >= 0.2, "the best is the strong trial or one that copied it (lr perturbed)"
