"""Which ``runtime_env`` a fork gets, decided without a cluster (issue 55, 10f): the parent's folders were uploaded
for it, and Ray deletes an upload once no live process names it, which on a cluster of several nodes can be soon
after the parent's supervisor exits. ``tests/test_one_start_path.py`` forks real runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain._ray_compat as compat
from nbtrain._client.run.forking import _runtime_env
from nbtrain._cluster.spec import RunSpec
from nbtrain._exceptions import NbtrainError
from nbtrain._options import RunOptions

pytestmark = pytest.mark.quick

UPLOAD = "gcs://_ray_pkg_0123456789abcdef.zip"


def _launched(given: dict | None) -> RunSpec:
    return RunSpec(options=RunOptions(name="parent", runtime_env={"working_dir": UPLOAD}), fn_bytes=b"",
                   fn_takes_config=False, runtime_env_given=given)


def test_the_parents_folders_still_here_are_uploaded_again_for_the_fork(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(compat, "uploads_missing", lambda env: [UPLOAD])  # dropped since the parent ended
    assert _runtime_env("parent", _launched({"working_dir": str(tmp_path)})) == {"working_dir": str(tmp_path)}


def test_the_parents_upload_serves_while_the_cluster_keeps_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(compat, "uploads_missing", lambda env: [])
    assert _runtime_env("parent", _launched({"working_dir": str(tmp_path / "gone")})) == {"working_dir": UPLOAD}


def test_a_dropped_upload_whose_folder_is_not_here_is_refused_naming_the_folder(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(compat, "uploads_missing", lambda env: [UPLOAD])
    with pytest.raises(NbtrainError) as refused:
        _runtime_env("parent", _launched({"working_dir": str(tmp_path / "gone")}))
    assert str(refused.value) == (
        f"The runtime_env folders of run 'parent' ({tmp_path / 'gone'}) were uploaded for it, and the cluster "
        "dropped the upload once the run ended; they are not on this machine to send again: give them to the fork, "
        "run.fork(runtime_env={'working_dir': ...}).")
