#!/usr/bin/env python
"""nbtrain.tune() against Ray Tune with Ray Train v2 TorchTrainer trainables, one sweep each (see benchmarks/README.md).

One command::

    python benchmarks/sweep.py            # 8 trials x 2 ranks, 10 reports each, 2 trials at a time
    python benchmarks/sweep.py --quick    # smoke run: 4 trials, 3 reports

Both sweeps run the same grid of learning rates over the same workload (the model and
data of ``workload.py``: 2 DDP ranks per trial, gloo, CPU, 1 thread per rank), one
report per "epoch" of a few steps, FIFO scheduling (no early stopping: both do the
same work), at most 2 trials at a time on a 4-CPU loopback cluster, 1 CPU per rank:

* ``nbtrain``  — ``nbtrain.tune(fn, space={"lr": tune.grid_search(...)}, workers_per_trial=2,
  max_concurrent=2)`` from this process over ``ray://``, which follows the sweep as its dashboard
  does (``sweep.refresh(wait_s=5)`` long polls, at most one per 250 ms);
* ``raytune``  — ``tune.Tuner(train_driver_fn, param_space={"train_loop_config": {...}},
  tune_config=TuneConfig(max_concurrent_trials=2))``, Ray's documented pattern for Ray Train v2:
  each trial is a function that runs ``TorchTrainer(...).fit()`` with ``ScalingConfig(num_workers=2)``
  and ``TuneReportCallback()``; the ranks call ``ray.train.report``. Its driver is a separate
  process on the head connected to the cluster's GCS (a plain Ray driver, not Ray Client).

Figures, per variant: per-trial launch → first report (a trial's launch is the sweep call for
the first wave, otherwise the last report of the trial whose slot it takes), the slot
hand-over alone, first → last report of a trial, total wall, and the reports the driver side
kept against those the ranks made. nbtrain keeps every rank's rows in each trial's run; Ray
Tune keeps what ``TuneReportCallback`` passes on (rank 0's). The log goes to stdout, the
figures and every trial's rows as JSON to ``benchmarks/results/sweep.json`` (``--quick``:
``sweep-quick.json``), which git ignores.

Hidden mode ``--raytune-driver`` is the Ray Tune driver subprocess.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"      # git-ignored except run_benchmarks.py's latest.json
sys.path.insert(0, str(HERE))

from run_benchmarks import StealMeter, driver_env, own_home, run_driver, write_json  # noqa: E402

import workload  # noqa: E402
from workload import BATCH_SIZE, ddp_setup  # noqa: E402  (module-level names: shipped by value)

VARIANTS = ("nbtrain", "raytune")
TITLES = {"nbtrain": "nbtrain.tune()", "raytune": "Ray Tune + Ray Train v2 TorchTrainer"}
WORKERS = 2                  # ranks per trial
MAX_CONCURRENT = 2           # trials at a time: 2 x 2 ranks x 1 CPU = the cluster's 4 CPUs
NUM_CPUS = 4
# 8 learning rates, about log-spaced over two decades; --trials N takes N of them, spread out
LRS = (0.001, 0.002, 0.004, 0.008, 0.015, 0.03, 0.06, 0.1)
FOLLOW_EVERY_S = 0.25        # the sweep dashboard's redraw interval: at most one long poll per tick


# ---------------------------------------------------------------------------- worker side (both variants)
def sweep_loop(report: Any, *, lr: float, reports: int, steps_per_report: int) -> None:
    """DDP-train ``reports`` epochs of ``steps_per_report`` steps; one report per epoch
    (mean loss, the rank, the worker's ``time.time()`` now and when this function began).
    The process group is already up."""
    entered = time.time()
    rank, images, labels, model, optimizer, loss_fn, batches = ddp_setup(lr)
    step = 0
    for epoch in range(1, reports + 1):
        total = 0.0
        for _ in range(steps_per_report):
            start = (step % batches) * BATCH_SIZE
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images[start:start + BATCH_SIZE]), labels[start:start + BATCH_SIZE])
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
        report(epoch=epoch, loss=total / steps_per_report, worker=rank, t=time.time(), entered=entered)


def nbtrain_trial(config: dict[str, Any]) -> None:
    import nbtrain

    sweep_loop(nbtrain.report, lr=config["lr"], reports=config["reports"],
               steps_per_report=config["steps_per_report"])


def raytrain_worker(config: dict[str, Any]) -> None:
    import ray.train

    sweep_loop(lambda **metrics: ray.train.report(metrics), lr=config["lr"], reports=config["reports"],
               steps_per_report=config["steps_per_report"])


def _median(values: list[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


# ---------------------------------------------------------------------------- nbtrain
def run_nbtrain(lrs: list[float], reports: int, steps_per_report: int, name: str, timeout: float) -> dict[str, Any]:
    """One ``nbtrain.tune()`` sweep, followed from here as its dashboard follows it."""
    from ray import tune

    import nbtrain
    from nbtrain._client.entry.sweep import TERMINAL as SWEEP_ENDED

    space = {"lr": tune.grid_search(list(lrs))}
    first_seen: dict[int, float] = {}
    launched = time.time()
    sweep = nbtrain.tune(nbtrain_trial, space=space, metric="loss", mode="min", num_samples=1, scheduler=None,
                         workers_per_trial=WORKERS, max_concurrent=MAX_CONCURRENT, name=name,
                         config={"reports": reports, "steps_per_report": steps_per_report}, cpus_per_worker=1)
    deadline = time.monotonic() + timeout
    answer = sweep.cached
    while True:
        before = time.perf_counter()
        answer = sweep.refresh(wait_s=5.0)
        now = time.time()
        for trial in answer.get("trials", []):
            if trial["iterations"] >= 1 and trial["index"] not in first_seen:
                first_seen[trial["index"]] = now
        if answer.get("state") in SWEEP_ENDED:
            break
        if time.monotonic() > deadline:
            sweep.stop()
            raise RuntimeError(f"nbtrain sweep {name} did not finish within {timeout:.0f} s")
        time.sleep(max(0.0, FOLLOW_EVERY_S - (time.perf_counter() - before)))
    ended = time.time()
    trials = []
    for trial in sweep.trials:
        rows: list[dict[str, Any]] = []
        events: dict[str, float] = {}
        if trial.run_name is not None:
            run = trial.run
            rows = [{key: row.get(key) for key in ("worker", "rank", "epoch", "loss", "t", "entered", "attempt")}
                    for row in run.metrics if "loss" in row]
            # where a trial's launch goes inside nbtrain: its run's supervisor up, then its ranks
            events = {event["message"].split()[0]: event["time"] for event in run.events
                      if event.get("kind") == "state"}
        trials.append({"trial": trial.index, "lr": trial.config.get("lr"), "state": trial.state,
                       "run_created": events.get("run"), "run_running": events.get("running"),
                       "error": trial.error, "stop_reason": trial.stop_reason,
                       "rank0_reports_at_tune": trial.iterations, "rows": rows,
                       "first_seen_by_driver": first_seen.get(trial.index)})
    return {"variant": "nbtrain", "name": name, "state": answer.get("state"), "error": answer.get("error"),
            "launched": launched, "ended": ended, "trials": trials,
            "driver_side": "the notebook (this process): rows from trial.run.metrics after the sweep; "
                           "first seen = the sweep table's long poll showing the trial's first iteration"}


# ---------------------------------------------------------------------------- Ray Tune + Ray Train v2
def run_raytune(lrs: list[float], reports: int, steps_per_report: int, name: str, timeout: float,
                gcs_address: str, out_dir: Path) -> dict[str, Any]:
    """One Ray Tune sweep, in a driver process of its own on the head (see :func:`raytune_driver`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--raytune-driver", "--gcs-address", gcs_address,
           "--driver-out", str(out_dir), "--name", name, "--lrs", ",".join(map(str, lrs)),
           "--reports", str(reports), "--steps-per-report", str(steps_per_report)]
    code, log_path = run_driver(cmd, driver_env(), out_dir, "raytune-driver.log", timeout)
    result_path = out_dir / "raytune-driver.json"
    if code != 0 or not result_path.exists():
        why = f"did not finish within {timeout:.0f} s" if code is None else f"exited {code}"
        raise RuntimeError(f"the Ray Tune driver {why}; see {log_path}:\n" + log_path.read_text()[-3000:])
    result: dict[str, Any] = json.loads(result_path.read_text())
    result["driver_side"] = ("the Tune driver process: rows in each trial's Result.metrics_dataframe; first seen "
                             "= the driver's Tune callback on_trial_result")
    return result


def raytune_driver(args: argparse.Namespace) -> None:
    """The Ray Tune driver: connect to the GCS, ``Tuner(...).fit()``, write what Tune kept."""
    import ray
    import ray.cloudpickle

    out_dir = Path(args.driver_out)
    ray.cloudpickle.register_pickle_by_value(workload)   # Ray's workers cannot import benchmarks/
    began = time.time()
    ray.init(address=args.gcs_address, logging_level="ERROR", log_to_driver=False)
    connect_s = time.time() - began

    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback
    from ray.tune.schedulers import FIFOScheduler

    storage = str(out_dir / "storage")
    arrivals: dict[str, list[float]] = {}

    class Arrivals(tune.Callback):
        """In this driver: when each trial's results reach Tune."""

        def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                            **info: Any) -> None:
            arrivals.setdefault(trial.trial_id, []).append(time.time())

    def train_driver_fn(config: dict[str, Any]) -> None:
        """Ray's documented Train v2 trainable: a Tune function that runs one TorchTrainer."""
        trainer = TorchTrainer(
            raytrain_worker,
            train_loop_config=config["train_loop_config"],
            scaling_config=ray.train.ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 1}),
            run_config=ray.train.RunConfig(name=f"train-trial_id={tune.get_context().get_trial_id()}",
                                           storage_path=storage, callbacks=[TuneReportCallback()]),
        )
        trainer.fit()

    lrs = [float(v) for v in args.lrs.split(",")]
    launched = time.time()
    # A Tune function takes 1 CPU by default; with it, 2 trials would need 6 of the 4 CPUs and only one
    # would run at a time. Its only job is to drive the Train run, so it asks for no CPU (a 1-byte memory
    # request: Tune refuses a trainable with no resource at all), as nbtrain's trial actor asks for none.
    trainable = tune.with_resources(train_driver_fn, {"memory": 1})
    tuner = tune.Tuner(
        trainable,
        param_space={"train_loop_config": {"lr": tune.grid_search(lrs), "reports": args.reports,
                                           "steps_per_report": args.steps_per_report}},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=1, scheduler=FIFOScheduler(),
                                    max_concurrent_trials=MAX_CONCURRENT),
        run_config=tune.RunConfig(name=args.name, storage_path=storage, callbacks=[Arrivals()]),
    )
    grid = tuner.fit()
    ended = time.time()
    trials = []
    for result in grid:
        frame = result.metrics_dataframe
        rows = [] if frame is None else [
            {key: (None if record.get(key) != record.get(key) else record.get(key))   # NaN → None
             for key in ("worker", "epoch", "loss", "t", "entered", "training_iteration")}
            for record in frame.to_dict("records")]
        trial_id = (result.metrics or {}).get("trial_id") or Path(result.path).name
        trials.append({"trial": trial_id, "lr": result.config["train_loop_config"]["lr"],
                       "state": "failed" if result.error else "succeeded",
                       "error": None if result.error is None else f"{type(result.error).__name__}: {result.error}",
                       "rank0_reports_at_tune": len(arrivals.get(trial_id, [])), "rows": rows,
                       "first_seen_by_driver": (arrivals.get(trial_id) or [None])[0]})
    path = out_dir / "raytune-driver.json"
    path.with_name(path.name + ".tmp").write_text(json.dumps({
        "variant": "raytune", "name": args.name, "state": "failed" if grid.errors else "succeeded",
        "error": "; ".join(map(str, grid.errors)) or None, "launched": launched, "ended": ended,
        "connect_s": connect_s, "trials": trials}, default=str))
    path.with_name(path.name + ".tmp").replace(path)
    ray.shutdown()


# ---------------------------------------------------------------------------- figures
def figures(run: dict[str, Any], reports: int) -> dict[str, Any]:
    """Per-trial and whole-sweep figures from the reports' own timestamps (``t``, set on the rank).

    A trial's launch is the sweep call for the first ``MAX_CONCURRENT`` trials to report; for
    each later one, the last report of the trial whose slot it took (the earliest-ending trial
    still holding one), so its launch → first report is the slot's hand-over: the trial before
    ending, Tune starting this one, its processes and process group, and one epoch.
    """
    launched = run["launched"]
    started = []
    for trial in run["trials"]:
        rank0 = sorted((r for r in trial["rows"] if r.get("worker") == 0 and r.get("t") is not None),
                       key=lambda r: r["t"])
        trial["rank0_first_row"] = rank0[0] if rank0 else {}
        trial["first_report"] = rank0[0]["t"] if rank0 else None
        trial["last_report"] = rank0[-1]["t"] if rank0 else None
        trial["rows_kept"] = len(trial["rows"])
        trial["rows_by_rank"] = {str(w): sum(1 for r in trial["rows"] if r.get("worker") == w) for w in range(WORKERS)}
        if rank0:
            started.append(trial)
    started.sort(key=lambda t: t["first_report"])
    slots: list[float] = []          # when each trial still running leaves its slot (its last report)
    for order, trial in enumerate(started):
        anchor = launched if order < MAX_CONCURRENT else heapq.heappop(slots)
        heapq.heappush(slots, trial["last_report"])
        trial["wave"] = "first" if order < MAX_CONCURRENT else "later"
        trial["launch"] = anchor
        trial["launch_to_first_report_s"] = trial["first_report"] - anchor
        entered = trial["rank0_first_row"].get("entered")
        trial["launch_to_fn_start_s"] = None if entered is None else entered - anchor
        trial["first_epoch_s"] = None if entered is None else trial["first_report"] - entered
        for key in ("run_created", "run_running"):
            if trial.get(key) is not None:
                trial[f"launch_to_{key}_s"] = trial[key] - anchor
        trial["first_to_last_report_s"] = trial["last_report"] - trial["first_report"]
        seen = trial.get("first_seen_by_driver")
        trial["launch_to_driver_first_seen_s"] = None if seen is None else seen - anchor
    spans = [(t["first_report"], t["last_report"]) for t in started]
    overlap = max((sum(1 for a, b in spans if a <= start <= b) for start, _ in spans), default=0)
    expected = len(run["trials"]) * WORKERS * reports
    kept = sum(t["rows_kept"] for t in run["trials"])
    rank0_at_tune = sum(min(t["rank0_reports_at_tune"], reports) for t in run["trials"])
    return {
        "trials": len(run["trials"]), "trials_ok": sum(1 for t in run["trials"] if t["state"] == "succeeded"),
        "launch_to_first_report_s": _median([t["launch_to_first_report_s"] for t in started]),
        "first_wave_launch_to_first_report_s": _median([t["launch_to_first_report_s"] for t in started
                                                        if t["wave"] == "first"]),
        "handover_s": _median([t["launch_to_first_report_s"] for t in started if t["wave"] == "later"]),
        "launch_to_fn_start_s": _median([t["launch_to_fn_start_s"] for t in started]),
        "first_epoch_s": _median([t["first_epoch_s"] for t in started]),
        "launch_to_run_created_s": _median([t.get("launch_to_run_created_s") for t in started]),
        "launch_to_run_running_s": _median([t.get("launch_to_run_running_s") for t in started]),
        "launch_to_driver_first_seen_s": _median([t["launch_to_driver_first_seen_s"] for t in started]),
        "first_to_last_report_s": _median([t["first_to_last_report_s"] for t in started]),
        "total_wall_s": run["ended"] - launched,
        "rows_expected": expected, "rows_kept": kept, "rows_lost": expected - kept,
        "rank0_reports_expected": len(run["trials"]) * reports, "rank0_reports_at_tune": rank0_at_tune,
        "max_trials_at_once": overlap,
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}".replace(",", " ")


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}"


def build_table(summary: dict[str, dict[str, Any]], reports: int) -> str:
    nb, rt = summary.get("nbtrain", {}), summary.get("raytune", {})
    lines = [f"| figure | {TITLES['nbtrain']} | {TITLES['raytune']} | nbtrain / Ray Tune |", "|---|---|---|---|"]

    def row(label: str, key: str, digits: int = 1) -> None:
        lines.append(f"| {label} | {_fmt(nb.get(key), digits)} | {_fmt(rt.get(key), digits)} | "
                     f"{_ratio(nb.get(key), rt.get(key))} |")

    row("trial launch → first report (s, median of all trials)", "launch_to_first_report_s")
    row(f"… first {MAX_CONCURRENT} trials: sweep call → first report (s, median)",
        "first_wave_launch_to_first_report_s")
    row("… later trials: slot hand-over, last report of the trial before → first report (s, median)", "handover_s")
    row("… of which: trial launch → training function running on rank 0 (s, median)", "launch_to_fn_start_s")
    row("… of which: its first epoch (process group up, data, model, "
        "steps; s, median)", "first_epoch_s")
    row("trial launch → first report seen by the driver side (s, median)", "launch_to_driver_first_seen_s")
    row(f"a trial's first → last report ({reports - 1} epochs, s, median)", "first_to_last_report_s")
    row("total wall (s)", "total_wall_s")

    def kept(info: dict[str, Any]) -> str:
        if not info:
            return "—"
        return f"{info['rows_kept']} of {info['rows_expected']} ({info['rows_lost']} lost)"

    def rank0(info: dict[str, Any]) -> str:
        if not info:
            return "—"
        return f"{info['rank0_reports_at_tune']} of {info['rank0_reports_expected']}"

    lines.append(f"| reports kept on the driver side, every rank ({WORKERS} × {reports} per trial) | {kept(nb)} | "
                 f"{kept(rt)} | {_ratio(nb.get('rows_kept'), rt.get('rows_kept'))} |")
    lines.append(f"| rank 0's reports that reached Tune as results | {rank0(nb)} | {rank0(rt)} | "
                 f"{_ratio(nb.get('rank0_reports_at_tune'), rt.get('rank0_reports_at_tune'))} |")
    lines.append(f"| trials succeeded | {nb.get('trials_ok', '—')} of {nb.get('trials', '—')} | "
                 f"{rt.get('trials_ok', '—')} of {rt.get('trials', '—')} | |")
    lines.append(f"| most trials reporting at once | {nb.get('max_trials_at_once', '—')} | "
                 f"{rt.get('max_trials_at_once', '—')} | |")
    return "\n".join(lines)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions (one repetition: that run's figures); report counts summed."""
    per = [r["figures"] for r in runs]
    if not per:
        return {}
    out: dict[str, Any] = {key: _median([p[key] for p in per]) for key in (
        "launch_to_first_report_s", "first_wave_launch_to_first_report_s", "handover_s",
        "launch_to_driver_first_seen_s", "first_to_last_report_s", "total_wall_s", "launch_to_fn_start_s",
        "first_epoch_s", "launch_to_run_created_s", "launch_to_run_running_s")}
    for key in ("trials", "trials_ok", "rows_expected", "rows_kept", "rows_lost", "rank0_reports_expected",
                "rank0_reports_at_tune"):
        out[key] = sum(p[key] for p in per)
    out["max_trials_at_once"] = max(p["max_trials_at_once"] for p in per)
    out["reps_ok"] = len(per)
    return out


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=len(LRS), help=f"trials: learning rates of the grid "
                        f"(at most {len(LRS)}; default {len(LRS)})")
    parser.add_argument("--reports", type=int, default=10, help="reports (epochs) per trial (10)")
    parser.add_argument("--steps-per-report", type=int, default=5, help="training steps per epoch (5)")
    parser.add_argument("--reps", type=int, default=1,
                        help="sweeps per variant, interleaved, the order rotating (1)")
    parser.add_argument("--variants", default="nbtrain,raytune", help="comma-separated subset of nbtrain,raytune")
    parser.add_argument("--no-prewarm", action="store_true",
                        help="skip each variant's untimed 1-trial, 1-report sweep before the timed ones")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 trials, 3 reports")
    parser.add_argument("--timeout", type=float, default=900.0, help="per-sweep timeout (s)")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="where the JSON goes (results/sweep.json; --quick: results/sweep-quick.json)")
    parser.add_argument("--keep", action="store_true", help="keep the temp work dir (Ray Tune driver logs, storage)")
    # hidden: the Ray Tune driver subprocess
    parser.add_argument("--raytune-driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gcs-address", help=argparse.SUPPRESS)
    parser.add_argument("--driver-out", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--lrs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.reports = 4, 3
    if not 1 <= args.trials <= len(LRS):
        parser.error(f"need 1 ≤ --trials ≤ {len(LRS)}")
    if args.reports < 2 or args.steps_per_report < 1:
        parser.error("need --reports ≥ 2 and --steps-per-report ≥ 1")
    if args.out is None:
        args.out = str(RESULTS_DIR / ("sweep-quick.json" if args.quick else "sweep.json"))
    return args


def grid(trials: int) -> list[float]:
    """``trials`` learning rates of :data:`LRS`, spread over its range."""
    if trials == 1:
        return [LRS[0]]
    return [LRS[round(i * (len(LRS) - 1) / (trials - 1))] for i in range(trials)]


def _commit() -> str:
    """The repository's commit, and whether the nbtrain measured is that commit's."""
    import nbtrain

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "nbtrain"], cwd=HERE.parent,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    package = Path(nbtrain.__file__).resolve().parent
    if package != HERE.parent / "nbtrain":
        return f"{head} (nbtrain imported from {package})"
    return head + (" (nbtrain/ modified)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.raytune_driver:
        raytune_driver(args)
        return 0

    work = own_home("nbtrain-sweep-bench-")  # before nbtrain is imported
    import cloudpickle

    import nbtrain
    import nbtrain._client.local.local_cluster as local_cluster

    cloudpickle.register_pickle_by_value(workload)       # nbtrain's workers cannot import benchmarks/
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    lrs = grid(args.trials)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = "python benchmarks/sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = _commit()

    def log(*parts: Any) -> None:
        print(*parts, flush=True)

    log(f"# nbtrain sweep benchmark — {date}, commit {commit}")
    log(f"command: {command.strip()}")
    log(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; work dir {work}")
    log(f"sweep: {len(lrs)} trials (lr grid {lrs}) × {WORKERS} ranks, {args.reports} reports of "
        f"{args.steps_per_report} steps each (batch {BATCH_SIZE}/rank), FIFO, at most {MAX_CONCURRENT} trials at "
        f"once, {NUM_CPUS}-CPU cluster, 1 CPU per rank; {args.reps} rep(s); variants {', '.join(variants)}")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    errors: list[str] = []
    steal = StealMeter()
    started = time.time()
    try:
        t0 = time.monotonic()
        cluster = nbtrain.connect(num_cpus=NUM_CPUS, progress=lambda m: log(f"  [cluster] {m}"))
        info = local_cluster.status()
        if info is None:
            raise RuntimeError("the benchmark's local cluster is not running after connect()")
        log(f"cluster ready at {cluster.address} (GCS {info.gcs_address}) in {time.monotonic() - t0:.1f} s")
        import ray
        from ray import tune  # noqa: F401  (imported before any timing, as a notebook has it for its space)

        log(f"Ray {ray.__version__}; cluster resources {ray.cluster_resources().get('CPU')} CPU")

        def one(variant: str, tag: str, lrs: list[float], reports: int, steps: int) -> dict[str, Any]:
            name = f"bench-{tag}-{os.getpid()}"
            if variant == "nbtrain":
                return run_nbtrain(lrs, reports, steps, name, args.timeout)
            return run_raytune(lrs, reports, steps, name, args.timeout, info.gcs_address, work / f"raytune-{tag}")

        if not args.no_prewarm:
            for variant in variants:
                began = time.monotonic()
                try:
                    one(variant, f"prewarm-{variant}", lrs[:1], 2, 1)
                    log(f"prewarm {variant}: {time.monotonic() - began:.1f} s")
                except Exception as exc:  # noqa: BLE001 - reported, the timed sweeps still run
                    errors.append(f"prewarm {variant}: {exc}")
                    log(f"prewarm {variant} FAILED: {exc}")

        for rep in range(args.reps):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for variant in order:
                began = time.monotonic()
                load = os.getloadavg()[0]
                try:
                    run = one(variant, f"{variant}-r{rep}", lrs, args.reports, args.steps_per_report)
                except Exception as exc:  # noqa: BLE001 - one failed variant must not lose the other
                    errors.append(f"rep {rep} {variant}: {exc}")
                    log(f"rep {rep} {variant} FAILED after {time.monotonic() - began:.1f} s: {exc}")
                    traceback.print_exc()
                    continue
                run["rep"] = rep
                run["loadavg_before"] = load
                run["steal_pct"] = steal.percent(run["launched"], run["ended"])
                run["figures"] = figures(run, args.reports)
                runs[variant].append(run)
                fig = run["figures"]
                log(f"rep {rep} {variant}: {run['state']}, wall {fig['total_wall_s']:.1f} s, launch → first report "
                    f"{_fmt(fig['launch_to_first_report_s'], 2)} s (first wave "
                    f"{_fmt(fig['first_wave_launch_to_first_report_s'], 2)} s, hand-over {_fmt(fig['handover_s'], 2)}"
                    f" s), first → last report {_fmt(fig['first_to_last_report_s'], 2)} s, rows kept "
                    f"{fig['rows_kept']}/{fig['rows_expected']}, rank 0 at Tune {fig['rank0_reports_at_tune']}/"
                    f"{fig['rank0_reports_expected']}, at most {fig['max_trials_at_once']} trials at once, "
                    f"load before {load:.2f}, CPU stolen {run['steal_pct']:.0f} %")
                if run.get("error"):
                    log(f"  sweep error: {run['error']}")
                for trial in sorted(run["trials"], key=lambda t: t.get("first_report") or float("inf")):
                    log(f"  trial {trial['trial']} lr={trial['lr']}: {trial['state']}, wave {trial.get('wave', '—')}, "
                        f"launch → first report {_fmt(trial.get('launch_to_first_report_s'), 2)} s, first → last "
                        f"{_fmt(trial.get('first_to_last_report_s'), 2)} s, rows by rank {trial['rows_by_rank']}, "
                        f"rank 0 at Tune {trial['rank0_reports_at_tune']}"
                        + (f"; launch → run created {_fmt(trial.get('launch_to_run_created_s'), 2)} s → ranks running "
                           f"{_fmt(trial.get('launch_to_run_running_s'), 2)} s → function "
                           f"{_fmt(trial.get('launch_to_fn_start_s'), 2)} s" if variant == "nbtrain" else
                           f"; launch → function {_fmt(trial.get('launch_to_fn_start_s'), 2)} s")
                        + (f", error: {trial['error']}" if trial.get("error") else ""))
    finally:
        try:
            nbtrain.disconnect()
        except Exception:  # noqa: BLE001
            pass
        stopped = local_cluster.stop()
        log(f"local cluster stopped: {stopped}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    summary = {variant: summarise(runs[variant]) for variant in variants}
    table = build_table(summary, args.reports)
    log("")
    log(f"## Results ({len(lrs)} trials × {WORKERS} ranks, {args.reports} reports of {args.steps_per_report} steps, "
        f"{args.reps} rep(s); medians)")
    log("")
    log(table)
    if errors:
        log("")
        log("## Errors")
        for error in errors:
            log(f"- {error.splitlines()[0]}")
    log(f"\ntotal benchmark time {time.time() - started:.0f} s")
    out = Path(args.out)
    write_json(out, {
        "date": date, "commit": commit, "command": command.strip(),
        "machine": {"host": platform.node(), "cores": os.cpu_count(), "python": platform.python_version()},
        "args": {k: v for k, v in vars(args).items()
                 if k not in ("raytune_driver", "gcs_address", "driver_out", "name", "lrs")},
        "lrs": lrs, "summary": summary, "runs": runs, "errors": errors, "table": table,
    })
    log(f"JSON written to {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
