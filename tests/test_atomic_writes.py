"""Every file nbtrain writes whole goes through one helper: readers see the old file or the new one, the file is
the user's alone, threads writing at once do not trip over each other's temporary files, and a failed write
leaves nothing behind."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from nbtrain._paths import read_json, write_atomic, write_json_atomic

pytestmark = pytest.mark.quick


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("durable", [False, True])
def test_a_write_is_private_and_tightens_an_older_looser_file(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "made" / "state.json"
    target.parent.mkdir(mode=0o755)
    target.write_text("old")
    target.chmod(0o644)
    write_json_atomic(target, {"step": 3}, durable=durable)
    assert read_json(target) == {"step": 3}
    assert _mode(target) == 0o600 and _mode(target.parent) == 0o700
    assert sorted(os.listdir(target.parent)) == ["state.json"]


def test_threads_writing_one_file_at_once_each_land_whole(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.pt"
    payloads = [bytes([i]) * 100_000 for i in range(8)]
    errors: list[OSError] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(20):
                write_atomic(target, data, durable=False)
        except OSError as exc:  # two writers sharing a temporary file: one finds it gone
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(data,)) for data in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert target.read_bytes() in payloads
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_atomic(target, b"kept", durable=True)
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes", durable=True)  # type: ignore[arg-type]
    assert target.read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_a_sweep_trials_checkpoint_is_whole_or_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Population Based Training copies a trial's checkpoint into another: a save cut short (its meta never
    written) is no checkpoint, and a whole one carries the run's bytes and where they came from."""
    from nbtrain._cluster.sweep.tune_trial import CHECKPOINT_FILE, NbtrainTrial

    saver = object.__new__(NbtrainTrial)
    saver._run, saver.run_name, saver._last_result = object(), "sweep-t0", {"loss": 0.5}
    monkeypatch.setattr(saver, "_latest_checkpoint", lambda: ({"step": 40}, b"weights"), raising=False)
    cut_short = tmp_path / "cut-short"
    cut_short.mkdir()
    (cut_short / CHECKPOINT_FILE).write_bytes(b"wei")  # the data half-written, the meta never
    loader = object.__new__(NbtrainTrial)
    loader._spec = "untouched"
    loader.load_checkpoint(str(cut_short))
    assert loader._spec == "untouched", "a checkpoint cut short was taken for one"

    saved = tmp_path / "saved"
    saved.mkdir()
    saver.save_checkpoint(str(saved))
    assert sorted(os.listdir(saved)) == ["nbtrain-checkpoint.bin", "nbtrain-checkpoint.json"]
    assert (saved / CHECKPOINT_FILE).read_bytes() == b"weights"
    assert read_json(saved / "nbtrain-checkpoint.json") == {"step": 40, "from_run": "sweep-t0",
                                                            "last_result": {"loss": 0.5}}
