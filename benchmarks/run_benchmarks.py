#!/usr/bin/env python
"""nbtrain against torchrun and Ray Train v2 on the same CPU DDP workload (see benchmarks/README.md).

One command::

    python benchmarks/run_benchmarks.py [--reps 3] [--steps 200] [--warmup 20] [--out PATH]
    python benchmarks/run_benchmarks.py --quick          # smoke run: 40 steps, 1 rep, no Ray Train
    python benchmarks/run_benchmarks.py --skip-relaunch  # first launches only

The log goes to stdout; every repetition, the medians, the verdicts and the table
go as JSON to ``benchmarks/results/latest.json`` (``--quick``:
``benchmarks/results/quick.json``, not committed) or to ``--out PATH``.

It starts its own loopback Ray cluster (nbtrain's embedded local cluster, token
auth, 127.0.0.1 only) under a throwaway ``NBTRAIN_HOME``, so it never touches
another cluster, and stops it at the end. Per repetition it runs, interleaved
(the order rotates each repetition):

* ``torchrun``  — ``torchrun --nproc_per_node 2 benchmarks/workload.py``; a report is a stdout line;
* ``raytrain``  — Ray Train v2 ``TorchTrainer`` with ``ray.train.report`` every step, driven by a
  separate driver process connected to the same cluster over ``ray://`` (steps capped by
  ``--raytrain-steps``: its reports are slow);
* ``nbtrain``   — ``nbtrain.launch(fn, workers=2)`` from this process over ``ray://``, while this
  process follows the run like the live dashboard does: ``run.refresh(wait_s=1)``
  long polls, at most one per 250 ms (the dashboard's redraw interval), or, with
  ``--poll-ms N``, a plain poll every N ms.

Before the benchmark's own cluster starts, each repetition measures a **first launch on a just-started
cluster** (``--skip-just-started`` leaves it out): a driver process with its own ``NBTRAIN_HOME`` calls
``nbtrain.connect()`` (which starts a fresh embedded cluster and, as for every user, warms the first run's
ranks in the background), then at once ``nbtrain.launch()`` of the same workload, short
(``--relaunch-steps``), and records launch → first row in the driver, with the phases; the cluster is then
stopped. Its ratio is to torchrun's launch → first step (medians).

Right after each of these runs comes its **relaunch**, a short run
(``--relaunch-steps``) of the same variant launched the same way: what a notebook
user gets when they run the cell again. torchrun starts again; the Ray Train
driver calls ``TorchTrainer(...).fit()`` a second time; nbtrain launches the same
shape again, which takes the warm workers the run before left. nbtrain's idle warm
workers are ended (``nbtrain.release_warm()``) before each first launch and after
each relaunch, so its first launch starts its workers cold, as before warm workers
existed, and no idle rank sits through the other variants' runs.

Every variant runs :func:`workload.train_loop`; only the report function and the
launcher differ. Figures (medians over repetitions):

* launch → first step: wall time from the launch call (``Popen``, ``TorchTrainer(...)``,
  ``nbtrain.launch``) to the end of the first training step on the earliest rank;
* relaunch → first step: the same for the relaunch (only this figure and its wall time are
  kept from it: its few steps would skew the throughput and latency figures);
* steady samples/s: measured inside rank 0 from per-step timestamps after the warm-up;
* report() cost: median time of one report call inside the training loop (µs);
* report → driver p50: arrival time in the driver (for Ray Train: in its controller, via a
  ``UserCallback``) minus the ``time.time()`` the worker put in the report;
* total wall: launch call until the launcher sees the run finished;
* nbtrain's launch phases, for each first launch and relaunch (``Run.timeline()``: supervisor up, ranks
  assigned, group formed, function loaded, first step, first row in the notebook), each phase's share and
  its medians over repetitions in the log and the JSON (``phases``, ``relaunch_phases``).

Hidden modes: ``--raytrain-driver`` is the Ray Train driver subprocess, ``--just-started-driver`` the
just-started cluster's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"      # latest.json is committed; anything else written here is git-ignored
sys.path.insert(0, str(HERE))

import workload  # noqa: E402
from workload import train_loop  # noqa: E402  (a module-level name, so cloudpickle ships it by value)

VARIANTS = ("torchrun", "torchrun_malloc", "raytrain", "nbtrain", "nbtrain_slowpoll")
TITLES = {"torchrun": "torchrun", "torchrun_malloc": "torchrun + nbtrain's malloc settings",
          "raytrain": "Ray Train v2", "nbtrain": "nbtrain", "nbtrain_slowpoll": "nbtrain, slow poll"}
WORKERS = 2
RELAUNCH_WARMUP = 2        # a relaunch keeps only its launch → first step; its steps need not settle
RELEASE_WAIT_S = 30.0      # how long to wait for released warm workers' processes to exit

Outcome = dict[str, Any] | Exception   # a relaunch's summary, or what it raised


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _median(values: list[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def _load_results(out_dir: Path, variant: str) -> list[dict[str, Any]]:
    results = []
    for rank in range(WORKERS):
        path = out_dir / f"{variant}-rank{rank}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
    return results


def _summarise(variant: str, launched: float, ended: float, results: list[dict[str, Any]],
               latencies_ms: list[float] | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    if len(results) != WORKERS:
        raise RuntimeError(f"{variant}: expected {WORKERS} rank results, got {len(results)}")
    by_rank = sorted(results, key=lambda r: r["rank"])
    summary = {
        "variant": variant,
        "launch_to_first_step_s": min(r["first_step_end"] for r in by_rank) - launched,
        "samples_per_s": by_rank[0]["samples_per_s"],
        "report_us": statistics.median(r["report_us_median"] for r in by_rank),
        "report_us_p90": max(r["report_us_p90"] for r in by_rank),
        "latency_p50_ms": _quantile(latencies_ms, 0.5) if latencies_ms else None,
        "latency_p90_ms": _quantile(latencies_ms, 0.9) if latencies_ms else None,
        "latency_samples": len(latencies_ms or []),
        "total_wall_s": ended - launched,
        "steps": by_rank[0]["steps"], "warmup": by_rank[0]["warmup"],
        "steady_start": by_rank[0]["steady_start"], "steady_end": by_rank[0]["last_step_end"],
        "step_ms_median": by_rank[0]["step_ms_median"], "step_ms_p90": by_rank[0]["step_ms_p90"],
        "train_thread_cpu_share": [r["train_thread_cpu_share"] for r in by_rank],
        "process_cpu_share": [r["process_cpu_share"] for r in by_rank],
        "runqueue_wait_ms_per_step": [r.get("runqueue_wait_ms_per_step") for r in by_rank],
        "preemptions_per_step": [r.get("preemptions_per_step") for r in by_rank],
        "page_faults_per_step": [r.get("page_faults_per_step") for r in by_rank],
        "page_faults": _median([r.get("page_faults_per_step") for r in by_rank]),
        "worker_nice": [r["nice"] for r in by_rank], "final_loss": by_rank[0]["final_loss"],
        "params": by_rank[0]["params"], "pids": [r["pid"] for r in by_rank],
    }
    summary.update(extra or {})
    return summary


def _attempt(run: Callable[[], dict[str, Any]]) -> Outcome:
    """Run a relaunch; what it raises is returned, so a failed relaunch never loses its first run's figures."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - reported by the caller with the variant and repetition
        return exc


def phase_breakdown(phases: dict[str, float]) -> list[str]:
    """A launch's phases (``Run.timeline()``: seconds since the launch call, in order) as log lines: each phase's
    own share (since the one before) and when it ended, so a slower launch names the phase that grew."""
    lines, before = [], 0.0
    for phase, at in phases.items():
        lines.append(f"{phase:16s} +{at - before:6.3f} s  (at {at:6.3f} s)")
        before = at
    return lines


def median_phases(timelines: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over the runs that reached it, in the first run's order (then any others')."""
    order = list(dict.fromkeys(phase for timeline in timelines for phase in timeline))
    return {phase: statistics.median(t[phase] for t in timelines if phase in t) for phase in order}


def _relaunch_fields(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """What a run keeps of its relaunch: the launch time and wall only (its few steps would
    skew the throughput and latency figures), and how many of its ranks ran in the
    processes of the run before (nbtrain's warm workers; 0 for a launcher that starts anew)."""
    return {"relaunch_to_first_step_s": again["launch_to_first_step_s"],
            "relaunch_total_wall_s": again["total_wall_s"],
            "relaunch_steps": again["steps"], "relaunch_warmup": again["warmup"],
            "relaunch_reused_ranks": len(set(again["pids"]) & set(first["pids"])),
            "relaunch_phases": again.get("phases"), "relaunch_warm_ranks": again.get("warm_ranks")}


def _paired_ratio(runs: list[dict[str, Any]], torchrun_runs: list[dict[str, Any]],
                  key: str = "samples_per_s") -> float | None:
    """Median over repetitions of (this variant's samples/s ÷ torchrun's in the same repetition).

    The variants of one repetition run back to back, so the machine's slow drifts
    (other tenants, thermal state) hit both sides of each ratio alike.
    """
    base = {r["rep"]: r[key] for r in torchrun_runs if r.get(key) and r[key] == r[key]}
    ratios = [r[key] / base[r["rep"]] for r in runs if r.get(key) and r[key] == r[key] and r["rep"] in base]
    return statistics.median(ratios) if ratios else None


def _numbers(values: list[float | None], digits: int) -> str:
    """Per-rank figures as "a/b"."""
    return "/".join("—" if v is None else f"{v:.{digits}f}" for v in values)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# ---------------------------------------------------------------------------- torchrun
def own_home(prefix: str) -> Path:
    """A throwaway work dir whose ``home`` becomes ``NBTRAIN_HOME`` (call before nbtrain is imported):
    the benchmark starts its own cluster and token, and no Ray address or token of the caller leaks in."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["NBTRAIN_HOME"] = str(work / "home")
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        os.environ.pop(key, None)
    return work


def driver_env() -> dict[str, str]:
    """The environment of a plain Ray driver process on the benchmark's cluster."""
    import nbtrain._client.local.local_cluster as local_cluster

    env = local_cluster.ray_env()          # loopback, RAY_AUTH_MODE=token, this cluster's token file
    env["RAY_TRAIN_V2_ENABLED"] = "1"      # the default in Ray 2.60; said anyway
    env.pop("NBTRAIN_HOME", None)
    return env


def run_driver(cmd: list[str], env: dict[str, str], out_dir: Path, log_name: str,
               timeout: float) -> tuple[int | None, Path]:
    """Run a driver subprocess in ``out_dir``, its output to ``out_dir/log_name``; its exit code
    (None: killed at ``timeout``) and the log's path."""
    log_path = out_dir / log_name
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(out_dir))
        try:
            return proc.wait(timeout=timeout), log_path
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None, log_path


def write_json(out: Path, data: dict[str, Any]) -> None:
    """``data`` to ``out``, whole or not at all (a crash while writing leaves the old file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, default=str))
    partial.replace(out)


def run_torchrun(steps: int, warmup: int, out_dir: Path, timeout: float,
                 variant: str = "torchrun") -> dict[str, Any]:
    """torchrun as a user runs it; ``torchrun_malloc`` adds the glibc malloc thresholds
    nbtrain sets in its ranks (``nbtrain/_cluster/rank/allocator.py``), for a like-for-like figure."""
    from nbtrain._cluster.rank.allocator import MMAP_THRESHOLDS_BYTES, TRIM_THRESHOLD_BYTES

    out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NBTRAIN_", "MALLOC_"))}
    env["OMP_NUM_THREADS"] = "1"
    if variant == "torchrun_malloc":
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLDS_BYTES[-1])  # glibc ignores a larger one (allocator)
        env["MALLOC_TRIM_THRESHOLD_"] = str(TRIM_THRESHOLD_BYTES)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORKERS}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
           str(HERE / "workload.py"), "--steps", str(steps), "--warmup", str(warmup), "--out", str(out_dir),
           "--variant", variant]
    with open(out_dir / "torchrun.log", "w") as log:
        launched = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"torchrun did not finish within {timeout:.0f} s") from None
        ended = time.time()
    if code != 0:
        raise RuntimeError(f"torchrun exited {code}; see {out_dir / 'torchrun.log'}:\n"
                           + (out_dir / "torchrun.log").read_text()[-2000:])
    return _summarise(variant, launched, ended, _load_results(out_dir, variant), None)


# ---------------------------------------------------------------------------- Ray Train v2
def run_raytrain(steps: int, warmup: int, out_dir: Path, timeout: float, address: str,
                 poll_s: float | None, relaunch_steps: int | None) -> tuple[dict[str, Any], Outcome | None]:
    """One Ray Train driver process: its fit and, with ``relaunch_steps``, a second fit (the relaunch).

    The relaunch is a second ``TorchTrainer(...).fit()`` in the same driver, as in a notebook
    whose cell runs again: connected already, Ray Train imported. Returns the first fit's
    summary and the relaunch's summary, what failed it, or None when none was asked for.
    """
    again_dir = out_dir / "relaunch"
    again_dir.mkdir(parents=True, exist_ok=True)
    env = driver_env()
    if poll_s is not None:
        env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(poll_s)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--raytrain-driver", "--address", address,
           "--steps", str(steps), "--warmup", str(warmup), "--driver-out", str(out_dir)]
    cmd += ["--relaunch-steps", str(relaunch_steps)] if relaunch_steps else ["--skip-relaunch"]
    code, log_path = run_driver(cmd, env, out_dir, "raytrain-driver.log", timeout)
    why = f"did not finish within {timeout:.0f} s" if code is None else f"exited {code}"
    timing_path = out_dir / "raytrain-driver.json"
    if not timing_path.exists():   # written once the first fit is over: that one did not end
        raise RuntimeError(f"the Ray Train driver {why}; see {log_path}:\n" + log_path.read_text()[-3000:])
    timing = json.loads(timing_path.read_text())
    latencies = []
    arrivals = out_dir / "raytrain-arrivals.jsonl"
    if arrivals.exists():
        for line in arrivals.read_text().splitlines():
            record = json.loads(line)
            if record["step"] > warmup and record["t"] is not None:
                latencies.append((record["arrival"] - record["t"]) * 1000.0)
    first = _summarise("raytrain", timing["launched"], timing["ended"], _load_results(out_dir, "raytrain"),
                       latencies, {"connect_s": timing["connect_s"], "latency_where": "controller",
                                   "health_check_interval_s": poll_s})
    if not relaunch_steps:
        return first, None
    again = timing.get("relaunch")
    if again is None:
        error = timing.get("relaunch_error")
        text = (f"the second fit raised {error.strip().splitlines()[-1]}\n{error}" if error
                else f"the Ray Train driver {why} before its relaunch ended")
        return first, RuntimeError(f"{text}\nsee {log_path}")
    return first, _attempt(lambda: _summarise("raytrain", again["launched"], again["ended"],
                                              _load_results(again_dir, "raytrain"), None))


def raytrain_driver(args: argparse.Namespace) -> None:
    """The Ray Train v2 driver, in its own process: connect over ray://, fit (again for the relaunch),
    record timings."""
    import ray
    import ray.cloudpickle

    out_dir = Path(args.driver_out)
    ray.cloudpickle.register_pickle_by_value(workload)   # workers cannot import benchmarks/
    began = time.time()
    ray.init(args.address, logging_level="ERROR", log_to_driver=False)
    connect_s = time.time() - began

    from ray.train import RunConfig, ScalingConfig, UserCallback
    from ray.train.torch import TorchTrainer

    train_loop, write_result = workload.train_loop, workload.write_result

    class ArrivalRecorder(UserCallback):
        """Runs in the Ray Train controller: when did each report get there?"""

        def __init__(self, path: str) -> None:
            self.path = path

        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            now = time.time()
            with open(self.path, "a") as handle:
                for item in metrics:
                    handle.write(json.dumps({"arrival": now, "t": item.get("t"), "step": item.get("step")}) + "\n")

    def train_fn(config: dict[str, Any]) -> None:
        import ray.train

        result = train_loop(lambda **metrics: ray.train.report(metrics), steps=config["steps"],
                            warmup=config["warmup"], variant="raytrain")
        write_result(result, config["out"])

    def fit(name: str, out: Path, steps: int, warmup: int) -> dict[str, float]:
        launched = time.time()
        trainer = TorchTrainer(
            train_fn,
            train_loop_config={"steps": steps, "warmup": warmup, "out": str(out)},
            scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name=name, storage_path=str(out_dir / "raytrain-storage"),
                                 callbacks=[ArrivalRecorder(str(out / "raytrain-arrivals.jsonl"))]),
        )
        trainer.fit()
        return {"launched": launched, "ended": time.time()}

    def record(timing: dict[str, Any]) -> None:
        path = out_dir / "raytrain-driver.json"   # whole or absent, even if the parent kills this process
        path.with_name(path.name + ".tmp").write_text(json.dumps(timing))
        path.with_name(path.name + ".tmp").replace(path)

    timing: dict[str, Any] = {**fit(f"bench-{os.getpid()}", out_dir, args.steps, args.warmup), "connect_s": connect_s}
    record(timing)                 # now: a relaunch that hangs must not take the first fit's figures with it
    if not args.skip_relaunch:
        again_dir = out_dir / "relaunch"
        again_dir.mkdir(parents=True, exist_ok=True)
        try:  # a run name of its own, as a notebook's TorchTrainer gets each time its cell runs
            timing["relaunch"] = fit(f"bench-{os.getpid()}-relaunch", again_dir, args.relaunch_steps,
                                     RELAUNCH_WARMUP)
        except Exception:  # noqa: BLE001 - the parent reports it as this repetition's relaunch error
            timing["relaunch_error"] = traceback.format_exc()
        record(timing)
    ray.shutdown()


# ---------------------------------------------------------------------------- nbtrain
def _nbtrain_train(config: dict[str, Any]) -> dict[str, Any]:
    import nbtrain

    return train_loop(nbtrain.report, steps=config["steps"], warmup=config["warmup"], variant="nbtrain")


def run_nbtrain(steps: int, warmup: int, timeout: float, poll_ms: float, name: str,
                variant: str = "nbtrain") -> dict[str, Any]:
    import nbtrain
    from nbtrain import RunState
    from nbtrain._views.dashboard.follower import FOLLOW_POLL_S

    arrivals: list[tuple[float, dict[str, Any]]] = []
    poll_costs: list[float] = []
    launched = time.time()
    run = nbtrain.launch(_nbtrain_train, config={"steps": steps, "warmup": warmup}, workers=WORKERS,
                         cpus_per_worker=1, name=name)
    deadline = time.monotonic() + timeout
    state = RunState.PENDING
    while True:
        before = time.perf_counter()
        # poll_ms == 0: a long poll, as the dashboard does (answered as soon as a worker's batch lands)
        new_rows = run.refresh(wait_s=1.0 if poll_ms == 0 else 0.0)
        now = time.time()
        poll_costs.append(time.perf_counter() - before)
        arrivals.extend((now, row) for row in new_rows)
        # refresh() just fetched the summary too; reading it via run.state would poll a second time
        # and swallow the rows it fetched, so peek at the copy refresh() keeps.
        state = RunState(run.reader.summary["state"])
        if state.is_terminal:
            break
        if time.monotonic() > deadline:
            run.stop()
            raise RuntimeError(f"nbtrain run {name} did not finish within {timeout:.0f} s")
        if poll_ms:
            time.sleep(poll_ms / 1000.0)
        else:  # paced as the dashboard's follow loop is: at most one long poll per redraw interval
            time.sleep(max(0.0, FOLLOW_POLL_S - (time.perf_counter() - before)))
    ended = time.time()
    if state != RunState.SUCCEEDED:
        raise RuntimeError(f"nbtrain run {name} ended {state.value}:\n{run.error}")
    results = list(run.result or [])
    phases, warm_ranks = run.timeline(), (run.reader.summary.get("launch_phases") or {}).get("warm_ranks")
    latencies = [(arrival - row["t"]) * 1000.0 for arrival, row in arrivals
                 if "t" in row and row.get("step", 0) > warmup]
    try:
        run.delete()
    except Exception:  # noqa: BLE001 - cleanup only
        pass
    return _summarise(variant, launched, ended, results, latencies, {
        "rows_received": len(arrivals), "latency_where": "driver (run.refresh())",
        "poll_ms": poll_ms, "refresh_ms_median": statistics.median(poll_costs) * 1000.0 if poll_costs else None,
        "phases": phases, "warm_ranks": warm_ranks,
    })


# ---------------------------------------------------------------------------- a just-started cluster
def run_just_started(steps: int, warmup: int, out_dir: Path, timeout: float, num_cpus: int) -> dict[str, Any]:
    """A driver process that starts a fresh embedded cluster with ``connect()``, launches at once, and
    stops the cluster: its launch → first row, cluster start, phases (see :func:`just_started_driver`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NBTRAIN_"))}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--just-started-driver", "--steps", str(steps),
           "--warmup", str(warmup), "--num-cpus", str(num_cpus), "--driver-out", str(out_dir)]
    code, log_path = run_driver(cmd, env, out_dir, "just-started-driver.log", timeout)
    result_path = out_dir / "just-started.json"
    if code != 0 or not result_path.exists():
        why = f"did not finish within {timeout:.0f} s" if code is None else f"exited {code}"
        raise RuntimeError(f"the just-started driver {why}; see {log_path}:\n" + log_path.read_text()[-3000:])
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result


def just_started_driver(args: argparse.Namespace) -> None:
    """In its own process: ``connect()`` starts a fresh embedded cluster (its own home), ``launch()`` at once."""
    work = own_home("nbtrain-fresh-")
    import cloudpickle

    import nbtrain
    import nbtrain._client.local.local_cluster as local_cluster

    cloudpickle.register_pickle_by_value(workload)
    began = time.time()
    try:
        nbtrain.connect(num_cpus=args.num_cpus, progress=lambda m: print(f"  [cluster] {m}", flush=True))
        connected = time.time()
        result = run_nbtrain(args.steps, args.warmup, args.timeout, 0.0, name=f"fresh-{os.getpid()}")
        phases = result["phases"]
        write_json(Path(args.driver_out) / "just-started.json", {
            "cluster_and_connect_s": connected - began, "launch_to_first_row_s": phases.get("first_row"),
            "launch_to_first_step_s": result["launch_to_first_step_s"], "phases": phases,
            "warm_ranks": result["warm_ranks"]})
    finally:
        try:
            nbtrain.disconnect()
        finally:
            local_cluster.stop()
            shutil.rmtree(work, ignore_errors=True)


def release_warm_workers() -> int:
    """End this session's idle nbtrain workers (``nbtrain.release_warm()``) and wait until their
    processes have exited, so that their exit does not take CPU from the next timed launch.

    Returns how many ended. The cluster is on this machine, so their pids can be watched here.
    """
    import psutil

    import nbtrain
    from nbtrain._client.warm import is_this_session, warm_pools

    pids = [worker["pid"] for name, workers in warm_pools().items() if is_this_session(name)
            for worker in workers if worker["state"] == "idle" and worker["pid"]]
    ended = nbtrain.release_warm()

    def gone(pid: int) -> bool:
        try:
            return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + RELEASE_WAIT_S
    while ended and not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return ended


# ---------------------------------------------------------------------------- machine
def _cpu_times() -> list[int]:
    """The machine's aggregate CPU counters from /proc/stat (user … steal), or [] off Linux."""
    try:
        with open("/proc/stat") as stat:
            return [int(field) for field in stat.readline().split()[1:9]]
    except OSError:
        return []


class StealMeter:
    """How much CPU the hypervisor gave to other guests during any past window.

    On a shared VM the host takes a varying share of our cores ("steal"), which
    slows whichever variant happens to run; a rep with much steal says more about
    the host than about the launcher. Samples /proc/stat twice a second.
    """

    def __init__(self) -> None:
        self.samples: list[tuple[float, list[int]]] = []
        threading.Thread(target=self._sample, name="steal-meter", daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.samples.append((time.time(), _cpu_times()))
            time.sleep(0.5)

    def percent(self, start: float, end: float) -> float:
        inside = [counters for when, counters in self.samples if start <= when <= end and counters]
        if len(inside) < 2:
            return float("nan")
        delta = [b - a for a, b in zip(inside[0], inside[-1])]
        total = sum(delta)
        return 100.0 * delta[7] / total if total else 0.0


# ---------------------------------------------------------------------------- report
def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}".replace(",", " ")


def build_table(summary: dict[str, dict[str, Any]], variants: list[str], args: argparse.Namespace) -> str:
    head_cells = []
    for variant in variants:
        title = TITLES[variant]
        info = summary[variant]
        if variant == "raytrain":
            title += f" ({info.get('steps', args.raytrain_steps)} steps)"
        if variant == "nbtrain":
            title += f" (poll {args.poll_ms:g} ms)" if args.poll_ms else " (long poll)"
        if variant == "nbtrain_slowpoll":
            title = f"nbtrain (poll {args.slow_poll_ms:g} ms)"
        head_cells.append(title)
    lines = ["| figure | " + " | ".join(head_cells) + " |", "|---|" + "---|" * len(variants)]
    torch_rate = summary.get("torchrun", {}).get("samples_per_s")

    def row(label: str, key: str, digits: int) -> None:
        cells = []
        for variant in variants:
            value = summary[variant].get(key)
            cells.append(_fmt(value, digits))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    if any(summary[variant].get("just_started_first_row_s") is not None for variant in variants):
        row("just-started cluster: launch → first row (s)", "just_started_first_row_s", 2)
    row("launch → first step (s)", "launch_to_first_step_s", 1)
    if not args.skip_relaunch:
        row("relaunch → first step (s)", "relaunch_to_first_step_s", 2)
    row("steady samples/s", "samples_per_s", 0)
    ratios = []
    for variant in variants:
        rate = summary[variant].get("samples_per_s")
        ratios.append(_fmt(rate / torch_rate if rate and torch_rate else None, 2))
    lines.append("| ratio to torchrun (of medians) | " + " | ".join(ratios) + " |")
    row("ratio to torchrun (median of per-rep ratios)", "paired_ratio", 2)
    row("page faults per step (rank median)", "page_faults", 0)
    row("CPU stolen by the host while steady (%, median)", "steal_pct", 0)
    row("ratio to torchrun per non-stolen second (median of per-rep ratios; not the target)",
        "paired_ratio_unstolen", 2)
    costs = []
    for variant in variants:
        value = summary[variant].get("report_us")
        costs.append(_fmt(value, 1 if value is not None and value < 1000 else 0))
    lines.append("| report() cost (µs, median) | " + " | ".join(costs) + " |")
    latency = []
    for variant in variants:
        value = summary[variant].get("latency_p50_ms")
        text = _fmt(value, 0)
        if variant == "raytrain" and value is not None:
            text += " (to controller)"
        latency.append(text)
    lines.append("| report → driver latency p50 (ms) | " + " | ".join(latency) + " |")
    row("total wall (s)", "total_wall_s", 1)
    return "\n".join(lines)


def targets(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    nb = summary.get("nbtrain", {})
    tr = summary.get("torchrun", {})
    rt = summary.get("raytrain", {})
    checks = []

    def add(name: str, value: float | None, limit: float | None, ok: bool | None, text: str,
            info: bool = False) -> None:
        verdict = "INFO" if info else "N/A" if ok is None else ("PASS" if ok else "MISS")
        checks.append({"target": name, "value": value, "limit": limit, "verdict": verdict, "text": text})

    rate, base = nb.get("samples_per_s"), tr.get("samples_per_s")
    of_medians = rate / base if rate and base else None
    paired = nb.get("paired_ratio")
    # Both statistics must clear the bar: the verdict takes the lower one.
    ratio = min(of_medians, paired) if of_medians is not None and paired is not None else of_medians
    add("throughput ≥ torchrun's", ratio, 1.0, None if ratio is None else ratio >= 1.0,
        f"{_fmt(of_medians, 3)} × torchrun (ratio of medians), {_fmt(paired, 3)} (median of per-rep ratios); "
        f"per non-stolen second {_fmt(nb.get('paired_ratio_unstolen'), 3)} (information only, not the verdict)")
    tuned = summary.get("torchrun_malloc", {})
    if tuned.get("samples_per_s") and rate:
        paired_tuned = _fmt(nb.get("paired_ratio_malloc"), 3)
        add("like for like, not a target: nbtrain ÷ torchrun with nbtrain's malloc settings",
            rate / tuned["samples_per_s"], None, None,
            f"{_fmt(rate / tuned['samples_per_s'], 3)} (ratio of medians), {paired_tuned} (median of per-rep "
            f"ratios); nbtrain's ranks keep freed memory (nbtrain/_cluster/rank/allocator.py), torchrun's use glibc's "
            f"defaults unless told otherwise", info=True)
    launch, rt_launch = nb.get("launch_to_first_step_s"), rt.get("launch_to_first_step_s")
    limit = 0.5 * rt_launch if rt_launch else None
    add("launch ≤ 0.5 × Ray Train's", launch, limit,
        None if launch is None or limit is None else launch <= limit,
        f"{_fmt(launch, 1)} s vs limit {_fmt(limit, 1)} s" if limit else "Ray Train not run")
    tr_launch = tr.get("launch_to_first_step_s")
    limit = 1.2 * tr_launch if tr_launch else None
    add("first launch ≤ 1.2 × torchrun's", launch, limit,
        None if launch is None or limit is None else launch <= limit,
        f"{_fmt(launch, 2)} s vs limit {_fmt(limit, 2)} s (torchrun {_fmt(tr_launch, 2)} s); nbtrain's workers "
        f"started cold" if limit else "torchrun not run")
    again = nb.get("relaunch_to_first_step_s")
    others = ", ".join(f"{title} {_fmt(info['relaunch_to_first_step_s'], 2)} s"
                       for title, info in (("torchrun", tr), ("Ray Train", rt))
                       if info.get("relaunch_to_first_step_s") is not None)
    add("relaunch → first step < 1 s (nbtrain)", again, 1.0, None if again is None else again < 1.0,
        f"{_fmt(again, 2)} s; ranks that ran in the run before's warm workers: "
        f"{_fmt(nb.get('relaunch_reused_ranks'), 0)} of {WORKERS} (median)" + (f"; {others}" if others else "")
        if again is not None else "no relaunch measured")
    fresh = nb.get("just_started_first_row_s")
    limit = 0.3 * tr_launch if tr_launch else None
    add("just-started cluster: launch → first row ≤ 0.3 × torchrun's launch → first step", fresh, limit,
        None if fresh is None or limit is None else fresh <= limit,
        f"{_fmt(fresh, 2)} s vs limit {_fmt(limit, 2)} s (torchrun {_fmt(tr_launch, 2)} s; cluster start + connect "
        f"{_fmt(nb.get('just_started_connect_s'), 1)} s before it)" if fresh is not None else "not measured")
    rerun = (nb.get("relaunch_phases") or {}).get("first_row")
    limit = 0.05 * tr_launch if tr_launch else None
    add("re-run → first row ≤ 0.05 × torchrun's launch → first step", rerun, limit,
        None if rerun is None or limit is None else rerun <= limit,
        f"{_fmt(rerun, 2)} s vs limit {_fmt(limit, 2)} s" if rerun is not None else "no relaunch measured")
    cost, printed = nb.get("report_us"), tr.get("report_us")
    limit = 0.2 * printed if printed else None
    add("report() ≤ 0.2 × torchrun's print of the same row", cost, limit,
        None if cost is None or limit is None else cost <= limit,
        f"{_fmt(cost, 1)} µs vs limit {_fmt(limit, 1)} µs (torchrun's print {_fmt(printed, 1)} µs)")
    lat = nb.get("latency_p50_ms")
    add("report → notebook p50 < 250 ms", lat, 250.0, None if lat is None else lat < 250.0, f"{_fmt(lat, 0)} ms")
    return checks


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--raytrain-steps", type=int, default=40,
                        help="steps for Ray Train (its per-step report costs ~2 s; default 40)")
    parser.add_argument("--raytrain-warmup", type=int, default=None,
                        help="warm-up steps for Ray Train (default: min(--warmup, raytrain-steps // 4))")
    parser.add_argument("--raytrain-poll-s", type=float, default=None,
                        help="set RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray's default 2 s) for the Ray Train variant")
    parser.add_argument("--raytrain-reps", type=int, default=None,
                        help="run Ray Train in the first N repetitions only (default: all). Its figures are "
                             "launch time and report cost; each of its runs takes minutes, which more "
                             "torchrun/nbtrain pairs put to better use")
    parser.add_argument("--skip-raytrain", action="store_true")
    parser.add_argument("--relaunch-steps", type=int, default=10,
                        help="steps of the relaunch after each run: the same launch again, as when a notebook "
                             f"cell runs again; only its launch → first step is kept ({RELAUNCH_WARMUP} warm-up; "
                             "default 10)")
    parser.add_argument("--skip-relaunch", action="store_true", help="no relaunch runs: first launches only")
    parser.add_argument("--skip-just-started", action="store_true",
                        help="no first launch on a just-started cluster (a fresh cluster per repetition)")
    parser.add_argument("--poll-ms", type=float, default=0.0,
                        help="nbtrain driver poll interval (ms); 0 (default) long-polls like the dashboard")
    parser.add_argument("--slow-poll-ms", type=float, default=None,
                        help="also run nbtrain polled only every this many ms (an extra column that shows "
                             "what the driver's polling costs the workers)")
    parser.add_argument("--torchrun-malloc", action="store_true",
                        help="also run torchrun with the glibc malloc thresholds nbtrain sets in its ranks "
                             "(an extra column: nbtrain's throughput like for like)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of torchrun,raytrain,nbtrain (default: all)")
    parser.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the benchmark's Ray cluster")
    parser.add_argument("--no-prewarm", action="store_true",
                        help="skip the untimed short run of each variant before the repetitions")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 40 steps, 10 warm-up, 1 rep, no Ray Train (relaunches kept)")
    parser.add_argument("--out", "--json", dest="out", default=None, metavar="PATH",
                        help="write every repetition, the medians, the verdicts and the table here as JSON "
                             f"(default: {RESULTS_DIR.relative_to(HERE.parent) / 'latest.json'}; with --quick "
                             f"{RESULTS_DIR.relative_to(HERE.parent) / 'quick.json'}, which git ignores)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp work dir (torchrun output, Ray Train driver log, per-rank results)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per-variant-run timeout (s)")
    # hidden: the Ray Train driver subprocess
    parser.add_argument("--raytrain-driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--just-started-driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--driver-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.reps, args.skip_raytrain = 40, 10, 1, True
    if args.out is None:
        args.out = str(RESULTS_DIR / ("quick.json" if args.quick else "latest.json"))
    if args.raytrain_warmup is None:
        args.raytrain_warmup = min(args.warmup, args.raytrain_steps // 4)
    if not (args.raytrain_driver or args.just_started_driver):
        if args.steps <= args.warmup or args.warmup < 1:
            parser.error("need 1 ≤ --warmup < --steps")
        if not args.skip_raytrain and not 1 <= args.raytrain_warmup < args.raytrain_steps:
            parser.error("need 1 ≤ --raytrain-warmup < --raytrain-steps")
        if not args.skip_relaunch and args.relaunch_steps <= RELAUNCH_WARMUP:
            parser.error(f"need --relaunch-steps > {RELAUNCH_WARMUP} (its warm-up)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.raytrain_driver:
        raytrain_driver(args)
        return 0
    if args.just_started_driver:
        just_started_driver(args)
        return 0

    work = own_home("nbtrain-bench-")  # before nbtrain is imported
    import cloudpickle

    import nbtrain
    import nbtrain._client.local.local_cluster as local_cluster

    cloudpickle.register_pickle_by_value(workload)       # nbtrain workers cannot import benchmarks/
    wanted = set(args.variants.split(",")) if args.variants else {"torchrun", "raytrain", "nbtrain"}
    if args.slow_poll_ms:
        wanted.add("nbtrain_slowpoll")
    if args.torchrun_malloc:
        wanted.add("torchrun_malloc")
    if args.skip_raytrain:
        wanted.discard("raytrain")
    unknown = wanted - set(VARIANTS)
    if unknown:
        print(f"unknown variant(s): {', '.join(sorted(unknown))}; choose from torchrun, raytrain, nbtrain")
        return 2
    variants = [v for v in VARIANTS if v in wanted]
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = "python benchmarks/run_benchmarks.py " + " ".join(sys.argv[1:] if argv is None else argv)
    def log(*parts: Any) -> None:
        print(*parts, flush=True)       # the run is long; keep a redirected log current

    log(f"# nbtrain benchmark — {date}")
    log(f"command: {command.strip()}")
    log(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"work dir {work}")
    log(f"workload: {WORKERS} DDP workers (gloo, CPU, 1 thread), {workload.build_model.__doc__.split(':')[0]}, "
        f"batch {workload.BATCH_SIZE}/worker, {workload.NUM_SAMPLES} synthetic samples; "
        f"{args.steps} steps ({args.warmup} warm-up), {args.reps} rep(s), variants {', '.join(variants)}")
    if "raytrain" in variants:
        log(f"NOTE: Ray Train runs only {args.raytrain_steps} steps ({args.raytrain_warmup} warm-up): "
            f"its per-step report is slow; its total wall is for those steps, not {args.steps}.")
        if args.raytrain_reps is not None and args.raytrain_reps < args.reps:
            log(f"NOTE: Ray Train runs in the first {args.raytrain_reps} of {args.reps} repetitions only.")
    if not args.skip_relaunch:
        log(f"relaunch: right after each run, the same launch again for {args.relaunch_steps} steps "
            f"({RELAUNCH_WARMUP} warm-up); only its launch → first step is kept. nbtrain's warm workers are "
            f"released before each first launch and after each relaunch.")
    all_runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    steal = StealMeter()
    errors: list[str] = []
    started = time.time()
    just_started: list[dict[str, Any]] = []
    try:
        if "nbtrain" in variants and not args.skip_just_started:
            for rep in range(args.reps):
                began = time.monotonic()
                try:
                    fresh = run_just_started(args.relaunch_steps, RELAUNCH_WARMUP, work / f"fresh-r{rep}",
                                             args.timeout, args.num_cpus)
                except Exception as exc:  # noqa: BLE001 - the other figures are still measured
                    errors.append(f"rep {rep} just-started: {exc}")
                    log(f"rep {rep} just-started FAILED after {time.monotonic() - began:.1f} s: {exc}")
                    continue
                just_started.append(fresh)
                log(f"rep {rep} just-started cluster: cluster start + connect {fresh['cluster_and_connect_s']:.1f} s, "
                    f"then launch → first row {_fmt(fresh['launch_to_first_row_s'], 2)} s "
                    f"({fresh['warm_ranks']}/{WORKERS} ranks warm):")
                for line in phase_breakdown(fresh["phases"]):
                    log(f"    {line}")
        t0 = time.monotonic()
        # warm=False: the first launches below start their workers cold (the just-started row has connect()'s)
        cluster = nbtrain.connect(num_cpus=args.num_cpus, progress=lambda m: log(f"  [cluster] {m}"), warm=False)
        address = cluster.address
        log(f"cluster ready at {address} in {time.monotonic() - t0:.1f} s (token: {local_cluster.token_path()})")
        import ray

        log(f"Ray {ray.__version__}; cluster resources {ray.cluster_resources().get('CPU')} CPU")

        def one(variant: str, rep: str, steps: int, warmup: int,
                relaunch: bool) -> tuple[dict[str, Any], Outcome | None]:
            """A variant's run and, with ``relaunch``, right after it the same launch again, short."""
            out = work / f"{variant}-{rep}"
            again_steps = args.relaunch_steps
            if variant in ("torchrun", "torchrun_malloc"):
                first = run_torchrun(steps, warmup, out, args.timeout, variant)
                return first, (_attempt(lambda: run_torchrun(again_steps, RELAUNCH_WARMUP, out / "relaunch",
                                                             args.timeout, variant)) if relaunch else None)
            if variant == "raytrain":
                return run_raytrain(steps, warmup, out, args.timeout, address, args.raytrain_poll_s,
                                    again_steps if relaunch else None)
            poll_ms, prefix = ((args.slow_poll_ms, "bench-slow") if variant == "nbtrain_slowpoll"
                               else (args.poll_ms, "bench"))

            def launch(steps: int, warmup: int, name: str) -> dict[str, Any]:
                return run_nbtrain(steps, warmup, args.timeout, poll_ms, variant=variant,
                                   name=f"{prefix}-{name}-{os.getpid()}")

            release_warm_workers()   # the first launch starts its workers cold: none left by an earlier run
            first = launch(steps, warmup, rep)
            again = _attempt(lambda: launch(again_steps, RELAUNCH_WARMUP, f"{rep}-relaunch")) if relaunch else None
            release_warm_workers()   # idle ranks must not sit through the other variants' runs
            return first, again

        if not args.no_prewarm:
            for variant in [v for v in variants if v != "nbtrain_slowpoll"]:
                began = time.monotonic()
                try:
                    one(variant, "prewarm", 4, 1, relaunch=False)
                    log(f"prewarm {variant}: {time.monotonic() - began:.1f} s")
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"prewarm {variant}: {exc}")
                    log(f"prewarm {variant} FAILED: {exc}")

        for rep in range(args.reps):
            active = [v for v in variants if v != "raytrain" or args.raytrain_reps is None or rep < args.raytrain_reps]
            order = active[rep % len(active):] + active[:rep % len(active)]
            for variant in order:
                steps, warmup = ((args.raytrain_steps, args.raytrain_warmup) if variant == "raytrain"
                                 else (args.steps, args.warmup))
                began = time.monotonic()
                try:
                    result, again = one(variant, f"r{rep}", steps, warmup, relaunch=not args.skip_relaunch)
                except Exception as exc:  # noqa: BLE001 - one failed variant must not lose the others
                    errors.append(f"rep {rep} {variant}: {exc}")
                    log(f"rep {rep} {variant} FAILED after {time.monotonic() - began:.1f} s: {exc}")
                    traceback.print_exc()
                    continue
                result["rep"] = rep
                result["steal_pct"] = steal.percent(result["steady_start"], result["steady_end"])
                result["samples_per_s_unstolen"] = (None if result["steal_pct"] != result["steal_pct"]  # NaN
                                                    else result["samples_per_s"] / (1.0 - result["steal_pct"] / 100.0))
                all_runs[variant].append(result)
                lat = result["latency_p50_ms"]
                log(f"rep {rep} {variant:8s}: launch→first step {result['launch_to_first_step_s']:.2f} s, "
                    f"{result['samples_per_s']:.0f} samples/s, report {result['report_us']:.1f} µs, "
                    f"latency p50 {'—' if lat is None else f'{lat:.0f} ms'}, wall {result['total_wall_s']:.1f} s, "
                    f"worker nice {result['worker_nice']}, "
                    f"CPU stolen by the host while steady {result['steal_pct']:.0f} %, "
                    f"step median {result['step_ms_median']:.1f} ms / p90 {result['step_ms_p90']:.1f} ms, "
                    f"rank CPU per wall s: training thread {_numbers(result['train_thread_cpu_share'], 2)}, "
                    f"process {_numbers(result['process_cpu_share'], 2)}; per step: waited for a core "
                    f"{_numbers(result['runqueue_wait_ms_per_step'], 1)} ms, preempted "
                    f"{_numbers(result['preemptions_per_step'], 0)} times, page faults "
                    f"{_numbers(result['page_faults_per_step'], 0)}")
                if result.get("phases"):
                    log(f"rep {rep} {variant:8s} launch phases ({result['warm_ranks']}/{WORKERS} ranks warm):")
                    for line in phase_breakdown(result["phases"]):
                        log(f"    {line}")
                if isinstance(again, Exception):
                    errors.append(f"rep {rep} {variant} relaunch: {again}")
                    log(f"rep {rep} {variant} relaunch FAILED: {again}")
                    traceback.print_exception(again)
                elif again is not None:
                    result.update(_relaunch_fields(result, again))
                    log(f"rep {rep} {variant:8s} relaunch ({again['steps']} steps): launch→first step "
                        f"{result['relaunch_to_first_step_s']:.2f} s, wall {result['relaunch_total_wall_s']:.1f} s, "
                        f"ranks in the processes of the run before {result['relaunch_reused_ranks']}/{WORKERS}")
                    if result.get("relaunch_phases"):
                        log(f"rep {rep} {variant:8s} relaunch phases ({result['relaunch_warm_ranks']}/{WORKERS} "
                            f"ranks warm):")
                        for line in phase_breakdown(result["relaunch_phases"]):
                            log(f"    {line}")
    finally:
        try:
            nbtrain.disconnect()
        except Exception:  # noqa: BLE001
            pass
        stopped = local_cluster.stop()
        log(f"local cluster stopped: {stopped}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    keys = ("launch_to_first_step_s", "relaunch_to_first_step_s", "samples_per_s", "report_us", "report_us_p90",
            "latency_p50_ms", "latency_p90_ms", "total_wall_s", "relaunch_total_wall_s", "relaunch_reused_ranks",
            "steal_pct", "samples_per_s_unstolen", "page_faults")
    summary: dict[str, dict[str, Any]] = {}
    for variant in variants:
        runs = all_runs[variant]
        summary[variant] = {key: _median([r.get(key) for r in runs]) for key in keys}
        summary[variant]["reps_ok"] = len(runs)
        summary[variant]["relaunch_reps_ok"] = sum(1 for r in runs if "relaunch_to_first_step_s" in r)
        for key in ("phases", "relaunch_phases"):
            if timelines := [r[key] for r in runs if r.get(key)]:
                summary[variant][key] = median_phases(timelines)
        if runs:
            summary[variant]["steps"] = runs[0]["steps"]
            summary[variant]["warmup"] = runs[0]["warmup"]
    if just_started and "nbtrain" in summary:
        summary["nbtrain"]["just_started_first_row_s"] = _median([r["launch_to_first_row_s"] for r in just_started])
        summary["nbtrain"]["just_started_connect_s"] = _median([r["cluster_and_connect_s"] for r in just_started])
        summary["nbtrain"]["just_started_phases"] = median_phases([r["phases"] for r in just_started])
    if "torchrun" in all_runs:
        for variant in variants:
            summary[variant]["paired_ratio"] = _paired_ratio(all_runs[variant], all_runs["torchrun"])
            summary[variant]["paired_ratio_unstolen"] = _paired_ratio(all_runs[variant], all_runs["torchrun"],
                                                                      "samples_per_s_unstolen")
    if "torchrun_malloc" in all_runs and "nbtrain" in all_runs:
        summary["nbtrain"]["paired_ratio_malloc"] = _paired_ratio(all_runs["nbtrain"], all_runs["torchrun_malloc"])
    table = build_table(summary, variants, args)
    checks = targets(summary)
    log("")
    log(f"## Results (medians over {args.reps} rep(s); {args.steps} steps, {args.warmup} warm-up"
        + (f"; Ray Train {args.raytrain_steps} steps, {args.raytrain_warmup} warm-up" if "raytrain" in variants else "")
        + ")")
    log("")
    log(table)
    log("")
    for variant in variants:
        for key, what in (("just_started_phases", "first launch on a just-started cluster"),
                          ("phases", "first launch"), ("relaunch_phases", "relaunch")):
            if summary[variant].get(key):
                log(f"## {variant}: where a {what}'s time went (medians, seconds since the launch call)")
                log("")
                log("\n".join(f"    {line}" for line in phase_breakdown(summary[variant][key])))
                log("")
    log("## nbtrain targets")
    log("")
    for check in checks:
        log(f"- {check['verdict']}: {check['target']} — {check['text']}")
    if errors:
        log("")
        log("## Errors")
        for error in errors:
            log(f"- {error.splitlines()[0]}")
    log(f"\ntotal benchmark time {time.time() - started:.0f} s")
    out = Path(args.out)
    write_json(out, {
        "date": date, "command": command.strip(), "machine": {"host": platform.node(), "cores": os.cpu_count(),
                                                              "python": platform.python_version()},
        "args": {k: v for k, v in vars(args).items()
                 if k not in ("raytrain_driver", "just_started_driver", "address", "driver_out")},
        "summary": summary, "runs": all_runs, "just_started": just_started, "targets": checks, "errors": errors,
        "table": table,
    })
    log(f"JSON written to {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
