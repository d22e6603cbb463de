"""A fork starts as every run does: its folders uploaded, Ray Data given room and its datasets, an ended run's
name numbered. Runs on the session's loopback cluster; each parent has ended (its supervisor gone) before it is
forked, so the fork is made from the parent's files."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain
from nbtrain._exceptions import InvalidOptionError


def reads_its_file(config):
    """Reads notes.txt by a relative path (the working_dir is the rank's current directory) and saves a checkpoint."""
    with open("notes.txt") as notes:
        text = notes.read()
    start = nbtrain.load_checkpoint() or {"step": 0}
    nbtrain.report(step=start["step"] + 1)
    nbtrain.save_checkpoint({"step": start["step"] + 1})
    return {"notes": text, "from_step": start["step"]}


def test_a_fork_of_a_run_with_a_local_working_dir_reads_its_files(cluster, tmp_path: Path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("shipped with the parent")
    parent = nbtrain.launch(reads_its_file, name="one-path-working-dir", workers=1,
                            runtime_env={"working_dir": str(folder)})
    assert parent.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, parent.error
    child = parent.fork(name="one-path-working-dir-child")
    assert child.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, child.error
    assert child.result == [{"notes": "shipped with the parent", "from_step": 1}]


def counts_its_shard(config):
    rows = [int(row["id"]) for row in nbtrain.get_dataset_shard("train").iter_rows()]
    start = nbtrain.load_checkpoint() or {"step": 0}
    nbtrain.report(step=start["step"] + 1, rows=len(rows))
    nbtrain.save_checkpoint({"step": start["step"] + 1})
    return sorted(rows)


def test_a_fork_of_a_run_with_datasets_is_given_them_again(cluster):
    import ray

    parent = nbtrain.launch(counts_its_shard, name="one-path-datasets", workers=1,
                            datasets={"train": ray.data.range(20)})
    assert parent.wait(timeout=240) == nbtrain.RunState.SUCCEEDED, parent.error
    assert parent.result == [list(range(20))]
    with pytest.raises(InvalidOptionError, match=r"launched with datasets= \(train\), which a run does not keep: "
                                                 r"give them to the fork again, run.fork\(datasets=\{'train': ...\}"):
        parent.fork(name="one-path-datasets-refused")
    child = parent.fork(name="one-path-datasets-child", datasets={"train": ray.data.range(30)})
    assert child.wait(timeout=240) == nbtrain.RunState.SUCCEEDED, child.error
    assert child.result == [list(range(30))]
    assert child.summary()["parent"] == {"run": "one-path-datasets", "step": 1}


def saves_once(config):
    start = nbtrain.load_checkpoint() or {"step": 0}
    nbtrain.report(step=start["step"] + 1)
    nbtrain.save_checkpoint({"step": start["step"] + 1})


def test_a_fork_named_as_an_ended_run_is_name_2(cluster, capfd: pytest.CaptureFixture[str]):
    parent = nbtrain.launch(saves_once, name="one-path-named", workers=1, wait=True)
    ended = nbtrain.launch(saves_once, name="one-path-taken", workers=1, wait=True)
    child = parent.fork(name="one-path-taken")
    assert child.name == "one-path-taken-2"
    assert "'one-path-taken' is an ended run (kept); this run is 'one-path-taken-2'" in capfd.readouterr().err
    assert child.wait(timeout=120) == nbtrain.RunState.SUCCEEDED, child.error
    assert ended.state == nbtrain.RunState.SUCCEEDED
    assert nbtrain.attach("one-path-taken").summary().get("parent") is None  # the ended run is left as it was
