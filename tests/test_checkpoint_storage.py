"""``storage=`` as a shared directory, a ``file://`` URI, or an object store reached through pyarrow.fs.

The object store is a real S3 server on 127.0.0.1: moto's (``moto[server]``), in
this process, spoken to by pyarrow's own S3 client from the ranks, the supervisor
and the notebook, exactly as they would speak to AWS. The URI carries the test
credentials and endpoint (pyarrow reads both from it), so no process needs
environment variables and nothing leaves the loopback. ``allow_delayed_open=true``
makes pyarrow send small objects as one PUT: moto answers the multipart upload's
completion in a way the AWS SDK inside pyarrow 26 reads as an error (the checkpoints
here are a few KB; real S3 takes both).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow.fs
import pytest
import torch

import nbtrain
from nbtrain._client.launching import starting as launching
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import KEEP_CHECKPOINTS, checkpoint_files, prune_checkpoints
from nbtrain._options import RunOptions
from nbtrain._paths import storage_root

from _train_fns import checkpoint_then_fail_once, make_two_layers, sharded_checkpoint_then_fail_once

BUCKET = "nbtrain-checkpoints"


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 with one bucket; session-wide, so runs can still be deleted at module end."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"{host}:{port}"
        filesystem, _ = pyarrow.fs.FileSystem.from_uri(_uri(endpoint, ""))
        filesystem.create_dir(BUCKET)
        yield endpoint
    finally:
        server.stop()


def _uri(endpoint: str, prefix: str) -> str:
    return (f"s3://test-key:test-secret@{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http"
            f"&region=us-east-1&allow_delayed_open=true&allow_bucket_creation=true")


def _keys(endpoint: str, prefix: str) -> list[str]:
    """The object keys under ``prefix`` of the bucket, read with pyarrow directly (not through nbtrain)."""
    filesystem, path = pyarrow.fs.FileSystem.from_uri(_uri(endpoint, prefix))
    infos = filesystem.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(info.path.removeprefix(path + "/") for info in infos if info.type == pyarrow.fs.FileType.File)


# ---------------------------------------------------------------------------------------------- the option


@pytest.mark.quick
def test_paths_and_uris_the_option_takes():
    assert RunOptions(storage="file:///mnt/shared%20disk/ckpt").storage == "/mnt/shared disk/ckpt"
    assert RunOptions(storage="/mnt/shared/ckpt").storage == "/mnt/shared/ckpt"
    for uri in ("s3://bucket/runs", "gs://bucket/runs", "gcs://bucket", "hdfs://namenode:8020/runs",
                "abfss://container@account.dfs.core.windows.net/runs"):
        assert RunOptions(storage=uri).storage == uri  # the scheme is checked; no server is asked
    for bad in ("ckpt", "ftp://host/x", "mock://x", "file://otherhost/x", "file:relative"):
        with pytest.raises(nbtrain.InvalidOptionError, match=r"storage \(--storage\) must be .*pyarrow.fs"):
            RunOptions(storage=bad)


@pytest.mark.quick
def test_uris_are_joined_under_their_path_and_shown_without_secrets():
    uri = "s3://KEY:SECRET@bucket/runs?region=eu-west-1&secret_key=S2"
    assert storage_uri.join(uri, "run", "checkpoints") == (
        "s3://KEY:SECRET@bucket/runs/run/checkpoints?region=eu-west-1&secret_key=S2")
    assert storage_uri.split(storage_uri.join(uri, "a", "b.pt")) == (storage_uri.join(uri, "a"), "b.pt")
    assert storage_uri.join("s3://bucket", "run") == "s3://bucket/run"
    assert storage_uri.join("/mnt/ckpt", "run") == "/mnt/ckpt/run"
    shown = storage_uri.shown(uri)
    assert "SECRET" not in shown and "S2" not in shown and "bucket/runs" in shown and "region=eu-west-1" in shown


# ------------------------------------------------- the storage_uri helpers, on a local directory and on S3


@pytest.mark.quick
@pytest.mark.parametrize("where", ["local directory", "S3 on loopback"])
def test_write_read_upload_download_prune_and_delete(where, tmp_path, request):
    """The helpers every process uses, against a real directory and a real S3 server (no cluster needed)."""
    base = str(tmp_path / "store") if where == "local directory" else _uri(request.getfixturevalue("s3_endpoint"),
                                                                           f"unit-{os.getpid()}")
    checkpoints = storage_uri.join(base, "run", "checkpoints")
    names = [f"checkpoint-a{attempt}-s{step}.pt" for attempt, step in ((1, 1), (1, 2), (2, 3))]
    for number, name in enumerate(names):
        storage_uri.write_bytes(storage_uri.join(checkpoints, name), f"weights {number}".encode())
        prune_checkpoints(storage_uri.join(checkpoints, name))
    assert sorted(storage_uri.list_names(checkpoints)) == sorted(names[-KEEP_CHECKPOINTS:])
    assert storage_uri.read_bytes(storage_uri.join(checkpoints, names[-1])) == b"weights 2"
    local = checkpoint_files("torch", None, storage_uri.join(checkpoints, names[-1]), tmp_path / "local")
    assert (local / "checkpoint.pt").read_bytes() == b"weights 2"

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"plan")
    (shards / "__0_0.distcp").write_bytes(b"rank 0")
    directory = storage_uri.join(checkpoints, "checkpoint-a2-s4.dcp")
    if storage_uri.is_remote(base):
        storage_uri.upload(shards, directory)
        copy = storage_uri.download(directory, tmp_path / "copy")
        assert sorted(p.name for p in copy.iterdir()) == [".metadata", "__0_0.distcp"]
        with storage_uri.local_copy(directory) as temporary:
            assert Path(temporary, "__0_0.distcp").read_bytes() == b"rank 0"
        assert not os.path.exists(temporary), "the temporary copy is removed"
    else:
        os.replace(shards, directory)
    prune_checkpoints(directory)
    assert sorted(storage_uri.list_names(checkpoints)) == [names[-1], "checkpoint-a2-s4.dcp"]
    storage_uri.delete(storage_uri.join(base, "run"))
    assert storage_uri.list_names(checkpoints) == []
    storage_uri.delete(storage_uri.join(base, "run"))  # gone already: fine


@pytest.mark.quick
def test_a_uri_that_cannot_be_written_is_refused_at_launch_naming_storage(s3_endpoint):
    missing = _uri(s3_endpoint, "runs").replace(BUCKET, "no-such-bucket").replace("&allow_bucket_creation=true", "")
    with pytest.raises(nbtrain.StorageError) as error:
        launching.check_writable(missing)
    message = str(error.value)
    assert message.startswith("storage (--storage) s3://***@no-such-bucket/runs?")
    assert "test-secret" not in message and "credentials" in message and "bucket or path exists" in message
    launching.check_writable(_uri(s3_endpoint, "probe"))
    assert _keys(s3_endpoint, "probe") == [], "the probe leaves nothing behind"


# ---------------------------------------------------------------------------------- runs on the cluster


def _assert_resumed_from_the_checkpoint(run, steps: int, fail_at: int) -> None:
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    assert run.result == [fail_at + 1] * 2, "both ranks of attempt 2 start from the checkpoint's step + 1"
    second = [row for row in run.metrics if row["attempt"] == 2]
    assert min(row["step"] for row in second) == fail_at + 1
    saved = run.load_checkpoint()
    assert saved["step"] == steps and torch.equal(saved["weights"], torch.full((3,), float(steps)))


def test_a_file_uri_keeps_the_run_and_its_checkpoints_in_that_directory(cluster, tmp_path):
    run = nbtrain.launch(checkpoint_then_fail_once, config={"steps": 6, "fail_at": 3}, workers=2, max_failures=1,
                         storage=f"file://{tmp_path}", name="file-uri-storage", warm=False)
    _assert_resumed_from_the_checkpoint(run, steps=6, fail_at=3)
    run_dir = tmp_path / "file-uri-storage"
    assert (run_dir / "state.json").exists(), "a file:// URI is a path: the history is there too"
    # the last two, and the one attempt 2 started from (its ranks may load it as long as it runs)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-a1-s3.pt",
                                                                           "checkpoint-a2-s5.pt",
                                                                           "checkpoint-a2-s6.pt"]
    run.delete()
    left = sorted(str(path.relative_to(run_dir)) for path in run_dir.rglob("*")) if run_dir.exists() else None
    assert left is None, f"left after delete(): {left}"


def test_checkpoints_go_to_an_s3_uri_and_the_history_stays_on_the_head(cluster, s3_endpoint):
    run = nbtrain.launch(checkpoint_then_fail_once, config={"steps": 6, "fail_at": 3}, workers=2, max_failures=1,
                         storage=_uri(s3_endpoint, "runs"), name="s3-storage", warm=False)
    _assert_resumed_from_the_checkpoint(run, steps=6, fail_at=3)
    assert _keys(s3_endpoint, "runs/s3-storage") == ["checkpoints/checkpoint-a1-s3.pt",  # attempt 2's start
                                                     "checkpoints/checkpoint-a2-s5.pt",
                                                     "checkpoints/checkpoint-a2-s6.pt"]
    assert (storage_root() / "s3-storage" / "state.json").exists()
    assert (run.checkpoint_dir() / "checkpoint.pt").exists()
    run.delete()
    assert _keys(s3_endpoint, "runs/s3-storage") == []
    assert not (storage_root() / "s3-storage").exists()


def test_sharded_checkpoints_are_uploaded_by_each_rank_and_restored_from_s3(cluster, s3_endpoint):
    run = nbtrain.launch(sharded_checkpoint_then_fail_once, workers=2, max_failures=1,
                         storage=_uri(s3_endpoint, "runs"), name="s3-sharded", warm=False)
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    expected = float(sum(p.detach().double().sum() + p.numel() for p in make_two_layers().parameters()))
    assert run.result == [pytest.approx(expected, rel=1e-6)] * 2
    directories = {key.partition("/")[0] for key in _keys(s3_endpoint, "runs/s3-sharded/checkpoints")}
    assert len(directories) == 1 and directories.pop().endswith(".dcp")
    files = [key.partition("/")[2] for key in _keys(s3_endpoint, "runs/s3-sharded/checkpoints")]
    assert ".metadata" in files and sum(name.endswith(".distcp") for name in files) == 2, files  # one per rank
    assert sorted(p.name for p in run.checkpoint_dir().iterdir()) == sorted(files)
    plain = make_two_layers()
    plain.load_state_dict(run.load_checkpoint()["model"])
    assert float(sum(p.detach().double().sum() for p in plain.parameters())) == pytest.approx(expected, rel=1e-6)
    run.delete()
    assert _keys(s3_endpoint, "runs/s3-sharded") == []
