"""``run.files()`` and ``run.download()``: what a run's ranks wrote where they worked, listed and brought back.

The decisions (which folder, which files, which names are refused) are units on a folder of this test's;
two real runs on the session cluster show the tasks on the ranks' node: one launched from a folder that is
gone (its ranks work in the run's own folder, as on a remote cluster), one from a folder it writes into.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

import nbtrain
from nbtrain._client.run.files import RunFile, chosen
from nbtrain._cluster.storage import written_files
from nbtrain._cluster.working_folder import RUN_FILES
from nbtrain._exceptions import InvalidOptionError, NbtrainError

BIG_MB = 100


def _where(tmp_path: Path, launch: Path | None, host: str | None = None) -> dict[str, object]:
    return {"launch": None if launch is None else str(launch), "launch_host": host or socket.gethostname(),
            "run_dir": str(tmp_path / "run")}


@pytest.mark.quick
def test_the_runs_own_folder_lists_every_file_and_a_launching_folder_only_those_the_run_wrote(tmp_path: Path):
    own = tmp_path / "run" / RUN_FILES
    (own / "plots").mkdir(parents=True)
    (own / "metrics.csv").write_text("step,loss\n")
    (own / "plots" / "loss.txt").write_text("0.5")
    elsewhere = _where(tmp_path, tmp_path / "notebook", host="another-machine")  # a rank on a remote node
    listed = written_files.list_written(elsewhere, since=None, until=None)
    assert listed["own"] and [name for name, _size, _when in listed["files"]] == ["metrics.csv", "plots/loss.txt"]

    notebook = tmp_path / "notebook"
    notebook.mkdir()
    (notebook / "data.csv").write_text("the user's, from before")
    os.utime(notebook / "data.csv", (1_000, 1_000))
    (notebook / "model.pt").write_bytes(b"weights")
    here = _where(tmp_path, notebook)
    listed = written_files.list_written(here, since=time.time() - 60, until=None)
    assert not listed["own"] and [name for name, _size, _when in listed["files"]] == ["model.pt"]


@pytest.mark.quick
def test_a_name_outside_the_runs_folder_is_refused(tmp_path: Path):
    folder = tmp_path / "run" / RUN_FILES
    folder.mkdir(parents=True)
    (tmp_path / "secret").write_text("not the run's")
    (folder / "link").symlink_to(tmp_path / "secret")
    where = _where(tmp_path, None)
    for name in ("../../secret", "link", str(tmp_path / "secret")):
        with pytest.raises(ValueError, match="outside the run's folder"):
            written_files.read_part(where, name, 0)
    listed = [RunFile("a.csv", 1, 0.0, (0,), "n", str(folder))]
    for name in ("../a.csv", "/etc/passwd", ""):
        with pytest.raises(InvalidOptionError, match=r"absolute paths and '\.\.' lead outside it"):
            chosen("r", listed, name)
    with pytest.raises(NbtrainError, match=r"no file matching 'b\*' in its folder \(it has: a\.csv\)"):
        chosen("r", listed, "b*")


@pytest.mark.quick
def test_a_name_two_nodes_wrote_lands_once_per_node():
    listed = [RunFile("out.txt", 1, 0.0, (0,), "10.0.0.1", "/r"), RunFile("out.txt", 1, 0.0, (1,), "10.0.0.2", "/r"),
              RunFile("only.txt", 1, 0.0, (0,), "10.0.0.1", "/r")]
    assert [path for path, _file in chosen("r", listed, "*.txt")] == ["10.0.0.1/out.txt", "10.0.0.2/out.txt",
                                                                     "only.txt"]


def writes_files(config):
    """Each rank writes a small file of its own; rank 0 also a CSV and a big file (config["big_mb"] MB)."""
    rank = nbtrain.get_context().rank
    Path("plots").mkdir(exist_ok=True)
    Path(f"plots/rank{rank}.txt").write_text(f"rank {rank}")
    if rank == 0:
        Path("metrics.csv").write_text("step,loss\n1,0.5\n")
        with open("big.bin", "wb") as out:
            for _ in range(config["big_mb"]):
                out.write(os.urandom(1024 * 1024))
    nbtrain.report(loss=0.5)


def test_a_runs_files_from_its_own_folder_are_listed_and_downloaded(cluster, tmp_path, monkeypatch):
    """Launched from a folder that is gone, the ranks work in the run's own folder, as on a remote cluster."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    run = nbtrain.launch(writes_files, workers=2, name="files-own-folder", config={"big_mb": BIG_MB})
    monkeypatch.chdir(tmp_path)
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    listed = run.files()
    assert [(file.name, file.ranks) for file in listed] == [
        ("big.bin", (0, 1)), ("metrics.csv", (0, 1)), ("plots/rank0.txt", (0, 1)), ("plots/rank1.txt", (0, 1))]
    assert {Path(file.folder).name for file in listed} == {RUN_FILES}
    assert next(file for file in listed if file.name == "big.bin").size == BIG_MB * 1024 * 1024

    assert run.download("plots/*", to=tmp_path / "got") == [tmp_path / "got" / "plots" / "rank0.txt",
                                                           tmp_path / "got" / "plots" / "rank1.txt"]
    assert (tmp_path / "got" / "plots" / "rank1.txt").read_text() == "rank 1"
    began = time.monotonic()
    [big] = run.download("big.bin", to=tmp_path / "got")
    took = time.monotonic() - began
    print(f"\n[run.download] {BIG_MB} MB from the run's folder in {took:.1f} s ({BIG_MB / took:.0f} MB/s)")
    assert big.stat().st_size == BIG_MB * 1024 * 1024
    assert sorted(os.listdir(tmp_path / "got")) == ["big.bin", "plots"]  # no partial file left
    with pytest.raises(InvalidOptionError, match="lead outside it"):
        run.download("../summary.json", to=tmp_path / "got")


def test_files_the_run_wrote_beside_the_notebook_are_its_and_the_others_are_not(cluster, tmp_path, monkeypatch):
    """On the embedded cluster the ranks work in the launching folder: only what they wrote there is listed."""
    (tmp_path / "notes.txt").write_text("the user's own")
    os.utime(tmp_path / "notes.txt", (1_000, 1_000))
    monkeypatch.chdir(tmp_path)
    run = nbtrain.launch(writes_files, workers=2, name="files-beside-notebook", config={"big_mb": 1})
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED
    assert [file.name for file in run.files()] == ["big.bin", "metrics.csv", "plots/rank0.txt", "plots/rank1.txt"]
    assert {file.folder for file in run.files()} == {str(tmp_path)}
