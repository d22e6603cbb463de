"""Failure injection on the real loopback cluster: restarts, reattach, supervisor loss, hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain._client.local import local_cluster

from _helpers import run_actor_names, wait_for
from _train_fns import train_steps


def _rows_of(run, attempt):
    return [r for r in run.metrics if r["attempt"] == attempt]


def _assert_no_duplicate_rows(run):
    keys = [(r["attempt"], r["rank"], r["step"]) for r in run.metrics]
    assert len(keys) == len(set(keys)), "duplicated (attempt, rank, step) rows"


def _train_steps_holding_in_attempt_1(config):
    """train_steps, except that attempt 1 stops after step ``hold_after`` and waits there to be killed.

    What attempt 1 reported and checkpointed is then fixed, however long the
    kill, its detection and the restart take.
    """
    if nbtrain.get_context().attempt == 1:
        train_steps({**config, "steps": config["hold_after"] + 1})
        time.sleep(3600)
    return train_steps(config)


def _steps_by_rank(rows) -> set[tuple[int, int]]:
    return {(r["rank"], r["step"]) for r in rows}


@pytest.mark.parametrize("checkpoint_every", [5, None], ids=["with-checkpoint", "without-checkpoint"])
def test_killed_worker_restarts_the_group_and_training_resumes(cluster, checkpoint_every):
    name = f"restart-{'ckpt' if checkpoint_every else 'scratch'}"
    hold_after = 22
    run = nbtrain.launch(_train_steps_holding_in_attempt_1, workers=2, max_failures=1, name=name,
                         config={"steps": 40, "sleep": 0.05, "checkpoint_every": checkpoint_every,
                                 "hold_after": hold_after})
    wait_for(lambda: _steps_by_rank(run.metrics) >= {(0, hold_after), (1, hold_after)}, 180,
             message=f"both ranks to report step {hold_after}")
    pid = next(w["pid"] for w in run.workers if w["rank"] == 1)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: run.attempt == 2, 30, interval=0.05, message="the restart")
    detected = time.monotonic() - killed_at
    wait_for(lambda: _rows_of(run, 2), 120, interval=0.1, message="rows from attempt 2")
    restarted = time.monotonic() - killed_at
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    print(f"{name}: failure detected {detected:.1f} s after kill -9, training again after {restarted:.1f} s")
    assert detected < 10
    # train_steps: rank 0 saves a checkpoint after reporting each step divisible by checkpoint_every
    # (0, 5, ..., 20 before the hold at 22), and a restarted attempt continues one step after the
    # checkpoint it loads: step 21. Without checkpoints it starts again at 0.
    resume_step = hold_after // checkpoint_every * checkpoint_every + 1 if checkpoint_every else 0
    assert {r["attempt"] for r in run.metrics} == {1, 2}
    assert _steps_by_rank(_rows_of(run, 1)) == {(rank, step) for rank in (0, 1) for step in range(hold_after + 1)}
    attempt2 = _steps_by_rank(_rows_of(run, 2))
    expected = {(rank, step) for rank in (0, 1) for step in range(resume_step, 40)}
    checkpoints = [e["message"] for e in run.events if e["kind"] == "checkpoint"]
    assert attempt2 == expected, (f"attempt 2 should run steps {resume_step}..39 on both ranks; missing "
                                  f"{sorted(expected - attempt2)}, extra {sorted(attempt2 - expected)}; {checkpoints}")
    _assert_no_duplicate_rows(run)
    events = " ".join(e["message"] for e in run.events)
    assert f"Rank 1's worker process died (pid {pid}" in events and "attempt 2/2" in events


def test_killed_driver_leaves_the_run_going_and_a_new_process_sees_everything(cluster):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import cloudpickle, _train_fns, nbtrain
        cloudpickle.register_pickle_by_value(_train_fns)
        nbtrain.connect({cluster.address!r}, progress=lambda m: None)
        run = nbtrain.launch(_train_fns.train_steps, config={{"steps": 50, "sleep": 0.05}}, workers=2,
                             name="orphaned")
        while len(run.metrics) < 20:
            time.sleep(0.1)
        print("READY", flush=True)
        time.sleep(600)
    """)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "READY"
    finally:
        driver.kill()
        driver.wait()
    run = nbtrain.attach("orphaned")
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    keys = {(r["rank"], r["step"]) for r in run.metrics}
    assert keys == {(rank, step) for rank in (0, 1) for step in range(50)}
    _assert_no_duplicate_rows(run)


def test_killed_supervisor_is_restarted_with_its_history(cluster):
    import ray

    from nbtrain._cluster.names import NAMESPACE, actor_name

    run = nbtrain.launch(_train_steps_holding_in_attempt_1, workers=2, name="supervisor-dies",
                         config={"steps": 60, "sleep": 0.05, "checkpoint_every": 10, "hold_after": 20})
    wait_for(lambda: _steps_by_rank(run.metrics) >= {(0, 20), (1, 20)}, 180, message="both ranks to report step 20")
    before = run.metrics
    ray.kill(ray.get_actor(actor_name("supervisor-dies"), namespace=NAMESPACE), no_restart=False)
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED
    after = nbtrain.attach("supervisor-dies").metrics
    assert after[:len(before)] == before, "history recorded before the supervisor died was lost or changed"
    assert max(r["attempt"] for r in after) == 2
    assert any("supervisor process was restarted" in e["message"] for e in run.events)
    _assert_no_duplicate_rows(run)


def test_rank_stuck_before_a_collective_fails_by_the_collective_timeout(cluster):
    def stuck(config):
        import time as t

        import torch
        import torch.distributed as dist

        if nbtrain.get_context().rank == 1:
            t.sleep(3600)  # never joins the all-reduce
        dist.all_reduce(torch.ones(1))

    began = time.monotonic()
    run = nbtrain.launch(stuck, workers=2, name="stuck", collective_timeout_s=3)
    assert run.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.FAILED
    assert time.monotonic() - began < 90
    assert "Rank 0 raised" in run.error
    wait_for(lambda: not run_actor_names("stuck", run), 10, message="no actors left")


def test_nan_loss_is_reported_and_stop_on_nan_stops(cluster):
    def diverges(config):
        import time as t

        for step in range(1000):
            nbtrain.report(loss=float("nan") if step >= 5 else 1.0)
            t.sleep(0.05)

    run = nbtrain.launch(diverges, workers=1, name="nan-stop", stop_on_nan=True)
    assert run.wait(timeout=120, raise_on_failure=False) == nbtrain.RunState.FAILED
    assert "NaN" in run.error
    assert any(e["kind"] == "nan" and "NaN for loss at step 6" in e["message"] for e in run.events)


def saves_then_loads(config):
    """Rank 0 saves a checkpoint first; every rank loads only once that save has landed (a barrier after it)."""
    import torch.distributed as dist

    ctx = nbtrain.get_context()
    if ctx.rank == 0:
        nbtrain.save_checkpoint({"saved_in_attempt": ctx.attempt})
    dist.barrier()
    loaded = nbtrain.load_checkpoint()
    nbtrain.report(step=ctx.attempt, loaded=-1 if loaded is None else loaded["saved_in_attempt"])
    if ctx.attempt == 1 and ctx.rank == 1:
        raise RuntimeError("fail attempt 1, so attempt 2 starts from its checkpoint")


def test_every_rank_loads_the_checkpoint_its_attempt_started_from_not_one_saved_since(cluster):
    run = nbtrain.launch(saves_then_loads, workers=2, max_failures=1, name="late-loader")
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED, run.error
    loaded = {(row["attempt"], row["rank"]): row["loaded"] for row in run.metrics}
    # attempt 1 started fresh; attempt 2 from attempt 1's checkpoint, not the one its rank 0 had just saved
    assert loaded == {(1, 0): -1, (1, 1): -1, (2, 0): 1, (2, 1): 1}, loaded
    assert run.load_checkpoint()["saved_in_attempt"] == 2  # the notebook reads the run's latest


def test_an_ended_runs_name_starts_name_2_and_resume_continues_from_the_checkpoint(cluster):
    config = {"steps": 10, "sleep": 0.0, "checkpoint_every": 3}
    first = nbtrain.launch(train_steps, config=config, workers=1, name="resumable")
    first.wait(timeout=120)
    again = nbtrain.launch(train_steps, config=config, workers=1, name="resumable")  # a new run: the name is kept
    assert again.name == "resumable-2" and again.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    resumed = nbtrain.launch(train_steps, config={**config, "steps": 15}, workers=1, name="resumable", resume=True)
    assert resumed.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    attempt2 = [r["step"] for r in resumed.metrics if r["attempt"] == 2]
    assert attempt2 == list(range(10, 15))  # last checkpoint at step 9 → continues at 10


def test_token_never_appears_in_logs_errors_or_the_registry(cluster):
    token = Path(local_cluster.status().token_path).read_text().strip()

    def leaky(config):
        import os as o

        print(dict(o.environ))
        raise RuntimeError(str(dict(o.environ)))

    run = nbtrain.launch(leaky, workers=1, name="leaky")
    run.wait(timeout=120, raise_on_failure=False)
    assert "RAY_AUTH_TOKEN_PATH" in run.logs()  # the environment was printed...
    assert token not in run.logs() and token not in run.error  # ...but it holds no token
    for path in (Path(os.environ["NBTRAIN_HOME"]) / "runs").rglob("*"):
        if path.is_file():
            assert token not in path.read_text(), path


def test_checkpoints_load_weights_only_unless_the_user_opts_out(cluster):
    def saves_an_object(config):
        import fractions  # an ordinary class, but not a tensor or container: refused by weights_only

        nbtrain.save_checkpoint({"ratio": fractions.Fraction(1, 3), "step": 3})

    run = nbtrain.launch(saves_an_object, workers=1, name="pickled-object", checkpoint_weights_only=False)
    run.wait(timeout=120)
    with pytest.raises(nbtrain.NbtrainError, match="weights_only=True protects against code in untrusted pickles"):
        run.load_checkpoint()
    import fractions

    assert run.load_checkpoint(weights_only=False)["ratio"] == fractions.Fraction(1, 3)


# A notebook of its own (Ray logs the warning once per process): a run whose spec is well past Ray's 100 KB inline
# limit, its config holding 300 KB.
BIG_SPEC_DRIVER = textwrap.dedent("""
    import nbtrain
    nbtrain.connect(progress=lambda message: None)
    def reports_its_blob(config):
        nbtrain.report(size=len(config["blob"]))
    run = nbtrain.launch(reports_its_blob, workers=1, name="big-spec", config={"blob": b"x" * 300_000})
    print(run.wait(timeout=120).value, run.metrics[-1]["size"])
""")


def test_a_big_runs_supervisor_depends_on_nothing_its_notebook_holds(cluster):
    """A supervisor restarts with its constructor's arguments: one Ray moved to the object store belongs to the
    notebook and is gone with it, and Ray said so in the cell (ray-project/ray#53727). The spec goes in parts Ray
    keeps inline, however big it is."""
    from nbtrain._cluster.supervisor.supervisor import SPEC_PART_BYTES, spec_parts

    spec = b"s" * (3 * SPEC_PART_BYTES + 5)
    assert [len(part) for part in spec_parts(spec)] == [SPEC_PART_BYTES] * 3 + [5]
    assert b"".join(spec_parts(spec)) == spec
    done = subprocess.run([sys.executable, "-c", BIG_SPEC_DRIVER], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["succeeded", "300000"]
    assert "constructor arguments in the object store" not in done.stderr, done.stderr[-3000:]
