"""Warm workers: a relaunch of the same shape takes the previous run's idle processes, started afresh.

Real loopback cluster. Each test gives its runs an ``env`` of its own, so its workers'
shape differs from every other test's and they are its own (a lease of another shape
ends the idle workers of the shape before). Whether a process is alive is asked of the
OS: the cluster is on this machine. Which idle worker a rank is lent (fewer or more ranks,
another shape, a GPU's view) is decided in the pool: ``test_warm_pool_units.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import nbtrain
from nbtrain._client.local import local_cluster
from nbtrain._client.warm import WARM_START_ENV, warm_pools

from _helpers import ipython_shell, pid_alive, wait_for

REPO = Path(__file__).resolve().parent.parent


def leftovers(config):
    """Reports what a previous run in this process left: a global, an env variable, the RNG; then leaves them."""
    import os as _os
    import random

    import torch

    context = nbtrain.get_context()
    found = {"global": "LEFT_BEHIND" in globals(), "env": "NBTRAIN_LEFT_BEHIND" in _os.environ,
             "torch_seed": torch.initial_seed(), "pid": _os.getpid(), "run_name": context.run_name,
             "config": dict(config), "world_size": context.world_size, "WORLD_SIZE": _os.environ.get("WORLD_SIZE"),
             "CUDA_VISIBLE_DEVICES": _os.environ.get("CUDA_VISIBLE_DEVICES")}
    globals()["LEFT_BEHIND"] = True
    _os.environ["NBTRAIN_LEFT_BEHIND"] = "1"
    torch.manual_seed(1234)
    random.seed(1234)
    nbtrain.report(step=1, left_global=float(found["global"]), left_env=float(found["env"]),
                   torch_seed=float(found["torch_seed"] % 1_000_000), pid=float(found["pid"]))
    return found


def _pids(run) -> list[int]:
    return sorted(worker["pid"] for worker in run.workers)


def _launch(name: str, shape: str, workers: int = 2, **options):
    run = nbtrain.launch(leftovers, name=name, workers=workers, env={"WARM_TEST_SHAPE": shape},
                         config=options.pop("config", {"run": name}), **options)
    run.wait(timeout=120)
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error
    return run


def _all_gone(pids: list[int]) -> bool:
    return not any(pid_alive(pid) for pid in pids)


def _launch_to_first_row(name: str, shape: str):
    """A run of ``shape``, the seconds from launch() to its first row in the notebook, once it succeeded."""
    started = time.monotonic()
    run = nbtrain.launch(leftovers, name=name, workers=2, env={"WARM_TEST_SHAPE": shape}, config={"run": name})
    wait_for(lambda: run.refresh(wait_s=0.5) or run.reader.rows_since(0), 120, message=f"{name}'s first row")
    took = time.monotonic() - started
    run.wait(timeout=120)
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error
    return run, took


def test_a_relaunch_reuses_the_workers_started_afresh_and_reaches_its_first_step_sooner(cluster):
    first, first_launch_s = _launch_to_first_row("warm-first", "same")
    again, relaunch_s = _launch_to_first_row("warm-again", "same")

    assert _pids(again) == _pids(first)  # the same processes
    for result in again.result:          # ... each started afresh
        assert result["global"] is False and result["env"] is False, result
    seed_of = {r["pid"]: r["torch_seed"] for r in first.result}  # torch's seed as the process started with
    assert {r["pid"]: r["torch_seed"] for r in again.result} == seed_of
    assert relaunch_s < first_launch_s, (relaunch_s, first_launch_s)
    # ... and never sees the run before's name, config, world size or devices
    one = _launch("warm-one", "same", workers=1)
    assert _pids(one)[0] in _pids(again)
    for run, world in ((first, 2), (again, 2), (one, 1)):
        for result in run.result:
            assert result["run_name"] == run.name and result["config"] == {"run": run.name}, result
            assert result["world_size"] == world and result["WORLD_SIZE"] == str(world), result
            assert result["CUDA_VISIBLE_DEVICES"] in (None, ""), result  # no GPU asked for, none left from before

    printed = StringIO()  # %ray_status lists this notebook's idle warm workers with their time left
    with redirect_stdout(printed):
        ipython_shell().run_line_magic("ray_status", "")
    assert "warm workers of this notebook: 2 idle" in printed.getvalue(), printed.getvalue()
    for pid in _pids(again):
        assert f"pid {pid}" in printed.getvalue()

    from nbtrain._client.entry.cli import cluster_answer  # what the lab sidebar is served

    warm = cluster_answer(cluster)["cluster"]["warm"]
    assert warm["idle"] >= 2 and 0 < warm["next_exit_s"] <= 600, warm

    # `nbtrain cluster status` counts them, with their memory (a process with torch imported: 100s of MB)
    from nbtrain._client.local.warm_processes import warm_processes

    head = local_cluster.status()
    assert head is not None
    idle = {p.pid: p.rss_bytes for p in warm_processes(head.pid) if p.kind == "rank"}
    assert set(_pids(again)) <= set(idle) and all(idle[pid] > 100 * 2**20 for pid in _pids(again)), idle

    assert nbtrain.release_warm() == 2
    wait_for(lambda: _all_gone(_pids(again)), 30, message="released workers to exit")


def reports_until_stopped():
    import time as _time

    step = 0
    while True:
        step += 1
        nbtrain.report(step=step)
        _time.sleep(0.05)  # a pace: the test stops the run


def _idle_spares() -> list[int]:
    """The session cluster's idle worker processes for a supervisor (see spare_process); not the other lane's
    clusters'."""
    import psutil

    info = local_cluster.status()
    assert info is not None, "the session cluster is not running"
    found = []
    for process in psutil.Process(info.pid).children(recursive=True):
        try:
            if " ".join(process.cmdline()).startswith("ray::IDLE") \
                    and process.environ().get("NBTRAIN_PROCESS") == "run supervisor":
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def _has_loaded(pid: int, library: str) -> bool:
    """Whether process ``pid`` has a shared library whose path holds ``library`` mapped (imported, for Python)."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it ended (taken by a supervisor that has exited since): not readied in time to tell
        return False


def _ray_processes() -> list[tuple[int, str, str | None]]:
    """The session cluster's worker processes: pid, title, and which of nbtrain's they are (said on a failure)."""
    import psutil

    info = local_cluster.status()
    found = []
    for process in psutil.Process(info.pid).children(recursive=True) if info else []:
        try:
            title = " ".join(process.cmdline())[:60]
            if title.startswith("ray::"):
                found.append((process.pid, title, process.environ().get("NBTRAIN_PROCESS")))
        except psutil.Error:
            continue
    return found


def test_a_relaunchs_supervisor_takes_a_spare_process(cluster):
    """A supervisor needs a process nothing ran in: a warm run's supervisor has Ray start one for the next (once
    past its first step, or as it ends), as ``connect()`` did for the session's first. (Ray starts one only while
    the session has none idle: which run asked for the one taken is Ray's to decide.)"""
    import psutil
    import ray

    _launch("spare-first", "spare")
    # Ray starts the spare as the raylet can: on a 2-core box beside the other lane's notebooks, past a minute
    wait_for(_idle_spares, 150, message="a spare process for the next supervisor", describe=_ray_processes)
    # while it waits, the spare readies what Ray builds on an actor's first arguments (pydantic's serializers:
    # most of a new supervisor's start on an idle process otherwise)
    wait_for(lambda: any(_has_loaded(pid, "pydantic_core") for pid in _idle_spares()), 30,
             message="the spare to ready Ray's deserialization", describe=_idle_spares)
    relaunched = time.time()
    again = nbtrain.launch(reports_until_stopped, name="spare-again", workers=2, env={"WARM_TEST_SHAPE": "spare"})
    try:
        pid = ray.get(again.reader.channel.handle.__ray_call__.remote(lambda _supervisor: os.getpid()), timeout=60)
        assert psutil.Process(pid).create_time() < relaunched, "the relaunch's supervisor started a new process"
    finally:
        again.stop()
        nbtrain.release_warm()


def test_a_stopped_runs_ranks_end_at_one_step_and_the_next_run_takes_them_warm(cluster):
    """Stop, edit, run again: run.stop() has every rank end its function at one step (none left in a collective),
    the rows up to it all land, and the processes wait, warm, for the next run (they were killed before)."""
    run = nbtrain.launch(reports_until_stopped, name="stopped-warm", workers=2, env={"WARM_TEST_SHAPE": "stopped"})
    wait_for(lambda: all(sum(r["rank"] == rank for r in run.refresh() + run.metrics) >= 5 for rank in (0, 1)), 120,
             message="five rows from each rank")
    stopped_pids = _pids(run)
    assert run.stop() == nbtrain.RunState.STOPPED
    steps = {rank: [r["step"] for r in run.metrics if r["rank"] == rank] for rank in (0, 1)}
    assert steps[0] == list(range(1, len(steps[0]) + 1)) and steps[0] == steps[1], "every row, to one last step"
    assert {w["state"] for w in run.workers} == {"stopped"}
    again = _launch("stopped-warm-again", "stopped")
    assert _pids(again) == stopped_pids, "the stopped run's ranks took the next run, warm"
    nbtrain.release_warm()


def test_idle_workers_exit_after_warm_idle_s(cluster):
    run = _launch("warm-timeout", "timeout", warm_idle_s=10.0)
    assert not _all_gone(_pids(run))  # idle, warm
    wait_for(lambda: _all_gone(_pids(run)), 60, message="idle workers to exit after warm_idle_s")


def test_a_warm_worker_killed_while_idle_is_not_reused(cluster):
    first = _launch("warm-killed-1", "killed")
    killed, kept = _pids(first)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: _all_gone([killed]), 10, message="the killed worker to be gone")
    again = _launch("warm-killed-2", "killed")
    assert killed not in _pids(again) and kept in _pids(again), (_pids(first), _pids(again))
    nbtrain.release_warm()


def test_warm_false_leaves_no_worker(cluster):
    run = _launch("warm-off", "off", warm=False)
    wait_for(lambda: _all_gone(_pids(run)), 30, message="a warm=False run's workers to exit")


def test_warm_workers_end_with_the_notebook_session_that_made_them(cluster, tmp_path: Path):
    """A separate process is the notebook: it launches, waits for the run, prints the pids and exits."""
    script = tmp_path / "session.py"
    script.write_text(textwrap.dedent("""
        import json, nbtrain

        def train():
            import os
            nbtrain.report(step=1, pid=float(os.getpid()))

        nbtrain.connect()
        run = nbtrain.launch(train, name="warm-session", workers=2, env={"WARM_TEST_SHAPE": "session"})
        run.wait(timeout=120)
        print(json.dumps(sorted(w["pid"] for w in run.workers)))
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    pids = [int(pid) for pid in result.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    wait_for(lambda: _all_gone(pids), 90, message="the ended session's warm workers to exit",
             describe=lambda: warm_pools())


def test_a_new_sessions_first_launch_takes_the_rank_and_supervisor_processes_connect_warmed(cluster, tmp_path: Path):
    """A separate process is the notebook: connect() warms; once its processes are up (what `nbtrain cluster
    status` sees), the first launch, of the default shape, runs in them."""
    script = tmp_path / "first_launch.py"
    script.write_text(textwrap.dedent("""
        import json, os, time, nbtrain
        from nbtrain._client.local import local_cluster
        from nbtrain._client.local.warm_processes import warm_processes

        def train():
            import os
            nbtrain.report(step=1, pid=float(os.getpid()))

        connected = time.time()
        nbtrain.connect()
        head = local_cluster.status().pid
        def ours(kind):
            import psutil
            return [p.pid for p in warm_processes(head)
                    if p.kind == kind and psutil.Process(p.pid).create_time() >= connected]
        deadline = time.monotonic() + 240
        while not (len(ours("rank")) >= 2 and ours("supervisor")):  # the user's next cells
            assert time.monotonic() < deadline, (ours("rank"), ours("supervisor"))
            time.sleep(0.5)
        ranks, spares = ours("rank"), ours("supervisor")
        run = nbtrain.launch(train, name="warm-first-launch")
        import ray
        supervisor = ray.get(run.reader.channel.handle.__ray_call__.remote(lambda _s: os.getpid()), timeout=60)
        run.wait(timeout=120)
        print(json.dumps({"ranks": ranks, "spares": spares, "supervisor": supervisor,
                          "workers": sorted(w["pid"] for w in run.workers),
                          "warm_ranks": run.summary()["launch_phases"]["warm_ranks"], "state": run.state.value}))
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400,
                            cwd=tmp_path, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO), WARM_START_ENV: "1"})  # a user's default
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warming 2 ranks (1 CPU each) for the first run" in result.stderr, result.stderr[-2000:]
    import json

    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["state"] == "succeeded", seen
    assert seen["warm_ranks"] == 2 and set(seen["workers"]) <= set(seen["ranks"]), seen
    assert seen["supervisor"] in seen["spares"], "the first launch's supervisor took the spare connect() asked for"
