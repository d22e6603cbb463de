"""A run's data is kept as reported, read without breaking, and gone when the run is deleted.

- ``report()`` values of every kind (text, NaN, ±inf, metrics named like a row's own keys)
  arrive in ``run.metrics``, the latest values, the stored files and ``attach()`` as sent;
- a run with an odd value (a NaN metric, a ``total_steps`` an older nbtrain accepted as text)
  breaks neither ``nbtrain.runs()``, ``attach()``, ``nbtrain runs --json`` nor the registry,
  and can still be deleted;
- ``Run.delete()`` removes the run's history, checkpoints, state and record, so its name
  launches afresh from step 0; files a run left without ``delete()`` are never taken up.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time

import cloudpickle
import pytest

import nbtrain
from nbtrain import _json, _registry
from nbtrain._client.connecting import connection
from nbtrain._client.entry.cli import cluster_answer
from nbtrain._client.run.handle import _readable
from nbtrain._cluster.names import find_supervisor
from nbtrain._cluster.spec import RunSpec, summarize_config
from nbtrain._options import RunOptions
from nbtrain._paths import run_index_dir, runs_dir, storage_root

import _reference_run
from _helpers import wait_for


def _refuse(token: str) -> None:
    raise AssertionError(f"not strict JSON: bare {token}")


def strict(text: str) -> object:
    """Parse as a strict JSON reader (a browser's JSON.parse) would."""
    return json.loads(text, parse_constant=_refuse)


# --------------------------------------------------------------------- without a cluster
@pytest.mark.quick
def test_registry_reads_every_run_though_one_file_is_broken_or_odd(tmp_path):
    directory = runs_dir(tmp_path)
    directory.mkdir(parents=True)
    (directory / "good.json").write_text(_json.dumps({
        "name": "good", "state": "running", "address": "ray://a", "created": 1.0, "updated": 2.0,
        "progress": {"step": 5, "total_steps": 10, "fraction": 0.5}, "latest": {"loss": 0.5}}))
    (directory / "odd.json").write_text(
        '{"name": "odd", "state": ["running"], "created": "yesterday", "workers": "2", "attempt": true, '
        '"progress": {"step": "5", "total_steps": "100", "fraction": NaN}, '
        '"latest": {"loss": NaN, "up": Infinity, "note": "warmup", "bad": {"x": 1}}, "error": 3}')
    (directory / "cut.json").write_text('{"name": "cut", "sta')
    (directory / "list.json").write_text("[1, 2]")
    (directory / "nameless.json").write_text('{"state": "running"}')

    runs = _registry.read_runs(tmp_path)

    assert sorted(run["name"] for run in runs) == ["good", "odd"]
    assert _registry.read_run("good", tmp_path)["progress"] == {"step": 5, "total_steps": 10, "fraction": 0.5}
    odd = _registry.read_run("odd", tmp_path)
    assert odd is not None
    assert odd["state"] == "unknown" and odd["created"] is None and odd["workers"] is None
    assert odd["attempt"] is None and odd["error"] is None
    assert odd["progress"] == {"step": 0, "total_steps": None, "fraction": None}
    assert math.isnan(odd["latest"]["loss"]) and odd["latest"]["up"] == math.inf
    assert odd["latest"]["note"] == "warmup" and "bad" not in odd["latest"]
    strict(_json.dumps(runs))


@pytest.mark.quick
def test_a_summary_with_odd_values_makes_a_record():
    summary = {"name": "old", "state": "running", "step": 5, "total_steps": "100", "world_size": True,
               "started": "noon", "now": 1.0, "owner": None, "error": None,
               "latest": {"loss": math.nan, "down": -math.inf, "phase": "warmup"}}
    record = _registry.record_from_summary(summary, "ray://a")
    assert record["progress"] == {"step": 5, "total_steps": None, "fraction": None}
    assert record["workers"] is None and record["created"] is None
    assert strict(_json.dumps(record))["latest"] == {"loss": "NaN", "down": "-Infinity", "phase": "warmup"}
    assert _registry.record_from_summary({"name": "x"}, "ray://a")["state"] == "unknown"


@pytest.mark.quick
def test_a_run_reads_odd_counts_of_an_older_supervisor_as_unknown():
    summary = _readable({"state": "running", "step": "3", "total_steps": "100", "total_epochs": 2.5})
    assert (summary["step"], summary["total_steps"], summary["total_epochs"]) == (0, None, None)
    assert _readable({"step": 4, "total_steps": 10})["total_steps"] == 10


@pytest.mark.quick
def test_the_config_summary_is_short_however_big_the_config():
    text = summarize_config(_reference_run.CONFIG | {"big": list(range(10**6))})
    assert len(text) <= 300
    assert text.startswith("key0='vvvv") and text.endswith("more)")
    assert summarize_config({"lr": 0.01, "optimizer": "adam"}) == "lr=0.01, optimizer='adam'"


# --------------------------------------------------------------------- on the cluster
def test_every_kind_of_reported_value_is_kept_everywhere(reference_run):
    """The reference run's two rows a rank (``tests/_reference_run.py``): keywords, then a dict with a keyword
    beside it, of text, NaN, ±inf and metrics named like a row's own keys, under a 1 MB config."""
    run, name = reference_run, _reference_run.NAME

    rows = run.metrics
    assert sorted((row["rank"], row["step"]) for row in rows) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for row in rows:
        assert row["attempt"] == 1 and isinstance(row["time"], float)  # the row's own keys are nbtrain's
        assert (row["user_rank"], row["user_attempt"], row["user_time"]) == (99, 7, "noon")
        assert math.isnan(row["loss"]) and row["up"] == math.inf and row["down"] == -math.inf
        assert row["phase"] == ("warmup" if row["step"] == 1 else "main")
    assert "report(rank=...) is kept as 'user_rank'" in run.logs(rank=0)

    summary = run.summary()
    assert "config" not in summary and len(summary["config_summary"]) <= 300
    assert summary["config_summary"].startswith("key0='vvv")
    assert run.config == _reference_run.CONFIG
    latest = summary["latest"]
    assert latest["phase"] == "main" and math.isnan(latest["loss"]) and latest["down"] == -math.inf
    assert latest["user_time"] == "noon"
    for worker in run.workers:
        assert worker["latest"]["phase"] == "main"
        assert worker["latest"]["lr"] == pytest.approx(0.1 * (worker["rank"] + 1))

    stored = stored_lines(storage_root() / name, "metrics")
    for line in stored:
        strict(line)
    assert _same(stored, rows)
    answer = next(r for r in strict(_json.dumps(cluster_answer(connection.current())))["runs"] if r["name"] == name)
    assert answer["latest"]["loss"] == "NaN" and answer["latest"]["up"] == "Infinity"

    # the supervisor exits once the run has ended: a fresh attach reads the stored files
    wait_for(lambda: find_supervisor(name) is None, 30, message="the finished run's supervisor to exit")
    again = nbtrain.attach(name)
    assert _same([_json.dumps(row) for row in again.metrics], rows)
    assert math.isnan(again.summary()["latest"]["loss"]) and again.summary()["latest"]["phase"] == "main"


def stored_lines(directory, kind: str) -> list[str]:
    """The JSON lines of a run's ``kind`` history, over its segment files."""
    return [line for segment in sorted((directory / kind).glob("*.jsonl"))
            for line in segment.read_text().splitlines()]


def _same(lines: list[str], rows: list[dict]) -> bool:
    """Rows equal, NaN included (compared as their strict JSON)."""
    return sorted(lines) == sorted(_json.dumps(row) for row in rows)


def report_nan_and_checkpoint(config):
    for step in (1, 2, 3):
        nbtrain.report(step=step, loss=math.nan, marker="old")
    nbtrain.save_checkpoint({"step": 3})
    return "old"


def report_fresh(config):
    nbtrain.report(step=1, marker="new")
    while not os.path.exists(config["go"]):  # the test says when this run may end
        time.sleep(0.05)
    nbtrain.report(step=2, marker="new", checkpoint=nbtrain.load_checkpoint() is not None)
    return "new"


def test_an_odd_run_breaks_nothing_and_delete_clears_its_name(cluster, tmp_path):

    from nbtrain._cluster.supervisor.supervisor import spec_parts, supervisor_actor, supervisor_options

    name = "odd-then-deleted"
    address = connection.current().address
    # a run an older nbtrain started: total_steps as text, which launch() now refuses
    options = RunOptions(name=name, workers=1, config={}, env={})
    object.__setattr__(options, "total_steps", "100")
    spec = RunSpec(options=options, fn_bytes=cloudpickle.dumps(report_nan_and_checkpoint), fn_takes_config=True)
    supervisor_actor().options(**supervisor_options(name)).remote(*spec_parts(cloudpickle.dumps(spec)))
    _registry.record_launch(name, address, notebook=None, workers=1, total_steps="100")  # type: ignore[arg-type]

    old = wait_for(lambda: _attached(name), 30, message="the odd run to answer")
    assert old.wait(timeout=60) == nbtrain.RunState.SUCCEEDED
    assert old.summary()["total_steps"] is None
    assert name in [run["name"] for run in nbtrain.runs()]
    answer = strict(_json.dumps(cluster_answer(connection.current())))
    record = next(r for r in answer["runs"] if r["name"] == name)
    assert record["progress"]["total_steps"] is None and record["latest"]["loss"] == "NaN"
    assert [r["name"] for r in _registry.read_runs() if r["name"] == name] == [name]
    assert (storage_root() / name / "state.json").exists()
    assert list((storage_root() / name / "checkpoints").glob("*.pt"))

    old.delete()
    assert not (storage_root() / name).exists()
    assert _registry.read_run(name) is None
    assert name not in [run["name"] for run in nbtrain.runs()]

    go = tmp_path / "go"
    new = nbtrain.launch(report_fresh, name=name, workers=1, config={"go": str(go)})
    wait_for(lambda: new.metrics, 60, message="the new run's first row")
    with pytest.raises(nbtrain.NbtrainError, match=r"is still running, so nothing was deleted\. Stop it first"):
        new.delete()
    assert stored_lines(storage_root() / name, "metrics")
    go.touch()
    assert new.wait(timeout=60) == nbtrain.RunState.SUCCEEDED
    assert [(row["step"], row["marker"]) for row in new.metrics] == [(1, "new"), (2, "new")]
    assert new.metrics[-1]["checkpoint"] is False and new.result == ["new"]

    # files of the name that the cluster's run index does not know (left by an nbtrain from before
    # the index, say) are never taken up: the next launch of the name is a new run
    wait_for(lambda: find_supervisor(name) is None, 30, message="the finished run's supervisor to exit")
    (run_index_dir() / f"{name}.json").unlink()
    third = nbtrain.launch(report_fresh, name=name, workers=1, config={"go": str(go)}, wait=True)
    assert [(row["step"], row["marker"]) for row in third.metrics] == [(1, "new"), (2, "new")]
    moved = [e["message"] for e in third.events if e["kind"] == "storage"]
    assert len(moved) == 1 and "held the files of an earlier run" in moved[0]
    earlier = list(storage_root().glob(f"{name}.earlier-*"))
    assert len(earlier) == 1 and str(earlier[0]) in moved[0]
    assert len(stored_lines(earlier[0], "metrics")) == 2
    third.delete()
    shutil.rmtree(earlier[0])


def _attached(name: str) -> nbtrain.Run | None:
    try:
        return nbtrain.attach(name)
    except nbtrain.NbtrainError:
        return None
