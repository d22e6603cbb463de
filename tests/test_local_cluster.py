"""The embedded cluster is private, single and on loopback: owner-only files, one head per home even
when two kernels connect at once, a recorded pid trusted only while it is our head, and no silent
reuse from another Python environment; its head is Ray's own ``ray start`` without the command line's other
commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import nbtrain
from nbtrain._client.local import local_cluster
from nbtrain._cluster.storage.run_storage import RunStorage
from nbtrain._paths import cluster_file, local_cluster_dir, ray_temp_dir, runs_dir, storage_root, write_json_atomic

from _helpers import wait_for


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _loose(root: Path, skip: Path | None = None) -> list[str]:
    """Every file or directory under ``root`` (itself included) that others may read, write or enter."""
    found = []
    for directory, dirnames, filenames in os.walk(root):
        if skip is not None and Path(directory) == skip:
            dirnames.clear()
            continue
        for path in [Path(directory), *(Path(directory) / name for name in filenames)]:
            if _mode(path) & 0o077:
                found.append(f"{path} {oct(_mode(path))}")
    return found


@pytest.fixture
def fresh_home(monkeypatch):
    """An empty NBTRAIN_HOME for this test, short enough for Ray's socket paths."""
    home = Path(tempfile.mkdtemp(prefix="nbt-"))
    monkeypatch.setenv("NBTRAIN_HOME", str(home))
    return home


def test_home_and_every_file_in_it_are_owner_only(fresh_home, tmp_path):
    fresh_home.chmod(0o755)  # a home left by an older nbtrain
    runs_dir().mkdir(mode=0o755)
    old = runs_dir() / "old.json"
    old.write_text("{}")
    old.chmod(0o644)

    write_json_atomic(old, {"name": "old"})
    write_json_atomic(cluster_file(), {"address": "ray://127.0.0.1:1"})
    storage = RunStorage(storage_root(), "run-a")
    storage.append("metrics", [{"step": 1, "loss": 0.5}])
    storage.save_state({"state": "running"})
    checkpoint = Path(storage.write_checkpoint({"attempt": 0, "step": 1}, b"weights"))

    assert _mode(fresh_home) == 0o700 and _mode(runs_dir()) == 0o700
    assert _mode(old) == 0o600, "a registry file written before stayed readable by others"
    assert {p.name for p in storage.dir.iterdir()} == {
        "checkpoints", "metrics", "logs", "events", "state.json"}
    assert checkpoint.exists()
    assert _loose(fresh_home) == []

    # storage= outside the home: the user's directory keeps its mode, the run's own directory is private
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    elsewhere = RunStorage(shared, "run-b")
    assert _mode(shared) == 0o755
    assert _loose(elsewhere.dir) == []


def test_ray_temp_dir_is_in_the_home_unless_its_socket_paths_would_be_too_long(fresh_home, monkeypatch):
    # Ray makes its temp dir 0777 whenever one of its processes starts: the owner-only directory around it
    # is what keeps other users out.
    fresh_home.chmod(0o755)
    temp_dir, note = local_cluster.choose_temp_dir()
    assert temp_dir == ray_temp_dir() == fresh_home / "ray"
    assert note is None and _mode(fresh_home) == 0o700

    long_home = fresh_home / ("h" * 60)
    monkeypatch.setenv("NBTRAIN_HOME", str(long_home))
    temp_dir, note = local_cluster.choose_temp_dir()
    try:
        assert temp_dir.parent.parent == Path("/tmp") and _mode(temp_dir.parent) == 0o700
        assert note is not None and str(long_home / "ray") in note and str(temp_dir) in note
        assert "too long for Ray's Unix socket paths" in note
    finally:
        shutil.rmtree(temp_dir.parent)


def test_a_recorded_pid_that_is_not_our_head_is_forgotten_never_killed(fresh_home):
    # A pid reused after a reboot: here a process group leader, as the head would be.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = {"pid": stranger.pid, "gcs_port": 1, "client_port": 2, "token_path": "x",
                  "temp_dir": str(fresh_home / "ray"), "num_cpus": 1, "num_gpus": 0, "started": 0.0}
        state = local_cluster_dir() / "local.json"
        write_json_atomic(state, record)
        assert local_cluster.stop() is False
        assert stranger.poll() is None, "stop() killed a process that is not the cluster's head"
        assert not state.exists()

        write_json_atomic(state, record)
        assert local_cluster.status() is None
        assert not state.exists()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


CONNECT = """
import json, os, sys, time
from pathlib import Path
import nbtrain
from nbtrain._client.local import local_cluster
Path(sys.argv[1]).touch()
while not Path(sys.argv[2]).exists():
    time.sleep(0.02)
say = lambda message: print(message, file=sys.stderr, flush=True)
cluster = nbtrain.connect(num_cpus=1, progress=say)
print(json.dumps({"address": cluster.address, "pid": local_cluster.status().pid}), flush=True)
"""


def _ray_processes_naming(text: str) -> dict[str, list[int]]:
    """Heads (``ray start --head``) and GCS servers with ``text`` in an argument (a temp dir, a port flag)."""
    found: dict[str, list[int]] = {"head": [], "gcs_server": []}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(text in arg for arg in args):
            continue
        if "start" in args and "--head" in args:
            found["head"].append(int(entry.name))
        elif args and args[0].endswith("gcs_server"):
            found["gcs_server"].append(int(entry.name))
    return found


def test_two_kernels_connecting_at_once_share_one_private_head(fresh_home, tmp_path):
    go = tmp_path / "go"
    kernels = [subprocess.Popen([sys.executable, "-c", CONNECT, str(tmp_path / f"ready{i}"), str(go)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NBTRAIN_HOME": str(fresh_home)}) for i in range(2)]
    heads: set[int] = set()
    try:
        wait_for(lambda: all((tmp_path / f"ready{i}").exists() for i in range(2)), timeout=60,
                 message="both kernels to import nbtrain")
        go.touch()
        outputs = [kernel.communicate(timeout=240) for kernel in kernels]
        answers = [json.loads(out.splitlines()[-1]) for out, _err in outputs if out.strip()]
        for answer in answers:  # every head the kernels reached, for the cleanup below
            port = answer["address"].rsplit(":", 1)[1]  # its GCS's as a driver, its Ray Client server's else
            flag = "--ray-client-server-port" if answer["address"].startswith("ray://") else "--port"
            heads.update(_ray_processes_naming(f"{flag}={port}")["head"])
        assert [kernel.returncode for kernel in kernels] == [0, 0], [err for _out, err in outputs]
        assert len(answers) == 2 and answers[0] == answers[1], answers

        info = local_cluster.status()
        assert info is not None and {info.pid} == heads == {answers[0]["pid"]}
        assert info.temp_dir == str(fresh_home / "ray")
        processes = _ray_processes_naming(info.temp_dir)
        assert processes["head"] == [info.pid] and len(processes["gcs_server"]) == 1, processes
        said = "\n".join(err for _out, err in outputs)
        assert "Another process is starting the local Ray cluster; waiting for it" in said
        assert f"Reusing the local Ray cluster at {info.gcs_address} (Ray Client: {info.address})" in said

        # private: the home, the cluster's state, token, log and lock (Ray's temp dir is inside the home)
        assert _loose(fresh_home, skip=fresh_home / "ray") == []
        assert {p.name for p in local_cluster_dir().iterdir()} >= {"local.json", "auth_token", "ray-start.log",
                                                                   "start.lock"}
        assert (info.python, info.prefix, info.nbtrain_version) == (sys.executable, sys.prefix, nbtrain.__version__)

        # the same environment under another name of its interpreter (`python3` beside `python`) connects
        state = local_cluster_dir() / "local.json"
        record = json.loads(state.read_text())
        write_json_atomic(state, {**record, "python": str(Path(sys.executable).with_name("python3-other-name"))})
        same = subprocess.run([sys.executable, "-c", "import nbtrain; nbtrain.connect(progress=print)"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "NBTRAIN_HOME": str(fresh_home)})
        assert same.returncode == 0, same.stderr

        # a kernel of another environment is told, not connected
        write_json_atomic(state, {**record, "python": "/opt/other-venv/bin/python", "prefix": "/opt/other-venv"})
        for named_by in ({}, {"RAY_ADDRESS": info.address}):  # started for it, or named by $RAY_ADDRESS
            other = subprocess.run([sys.executable, "-c", "import nbtrain; nbtrain.connect(progress=print)"],
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "NBTRAIN_HOME": str(fresh_home), **named_by})
            assert other.returncode != 0, named_by
            assert "VersionMismatchError" in other.stderr
            assert "was started from another environment (different sys.prefix)" in other.stderr
            assert "the cluster runs:  Python /opt/other-venv/bin/python" in other.stderr
            assert f"this notebook runs: Python {sys.executable}" in other.stderr
            assert "nbtrain cluster stop" in other.stderr

        assert local_cluster.stop() is True
        wait_for(lambda: _ray_processes_naming(info.temp_dir) == {"head": [], "gcs_server": []}, timeout=30,
                 message="the head and its GCS to exit")
        assert not state.exists() and not (fresh_home / "ray").exists()
    finally:
        for kernel in kernels:
            if kernel.poll() is None:
                kernel.kill()
        for pid in heads:  # the heads this test started, by process group, if anything above failed
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.quick
def test_the_heads_ray_start_leaves_out_the_other_commands_and_still_parses_rays_arguments():
    shown = subprocess.run([sys.executable, "-m", "nbtrain._client.local.ray_head_process", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]
    commands = {line.split()[0] for line in shown.stdout.split("Commands:", 1)[1].splitlines() if line.strip()}
    assert "start" in commands and "stop" in commands
    assert not commands & {"serve", "job", "list", "summary"}, "their imports are most of the command's start"
