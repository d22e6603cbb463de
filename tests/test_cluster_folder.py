"""The embedded cluster does not depend on where, or by which PATH, it was started.

One cluster for the module, started as a notebook's terminal would start it in the worst case:
``python -m nbtrain cluster start`` by a virtualenv's python that was never activated (no ``ray``
script beside it) with an empty ``PATH``, from a folder that is deleted right after. Then, from
"notebooks" (driver processes of that venv, each in its own folder): runs still start; a rank's
relative paths land in the notebook's folder, or in the run's own when that folder is gone; warm
workers do not carry one run's folder into the next; a rank process lost while starting is
started again, and one lost every time fails the run with its own last log lines.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nbtrain._client.local.local_head import LocalClusterInfo
from nbtrain._cluster.rank.actor.worker import FAULT_START_EXIT_ENV
from nbtrain._paths import read_json

from _helpers import venv_with_these_packages

DRIVER = """
import json, os, sys
import nbtrain

nbtrain.connect(progress=lambda _said: None)

def files_here(config):
    rank = nbtrain.get_context().rank
    with open(f"rank{rank}.txt", "w") as handle:
        handle.write(config["tag"])
    return os.getcwd()

def answer(run):
    state = run.wait(timeout=240, raise_on_failure=False)
    return {"name": run.name, "state": str(state.value), "result": run.result, "error": run.error,
            "startup": [e["message"] for e in run.events if e["kind"] == "startup"]}

answers = []
exec(sys.argv[1])
print("ANSWER " + json.dumps(answers), flush=True)
"""


@pytest.fixture(scope="module")
def moved_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's cluster; its ``env`` and ``python`` are what every driver runs with."""
    root = tmp_path_factory.mktemp("cluster-folder")
    python = venv_with_these_packages(root / "venv", with_pip=False) / "bin" / "python"
    assert not (python.parent / "ray").exists()
    home = Path(tempfile.mkdtemp(prefix="nbt-"))  # short: Ray's socket paths
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_ADDRESS", "VIRTUAL_ENV"))}
    env.update(NBTRAIN_HOME=str(home), PATH="", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    started_in = root / "started-here"
    started_in.mkdir()
    try:
        started = subprocess.run([str(python), "-m", "nbtrain", "cluster", "start", "--cpus", "2"], cwd=started_in,
                                 env=env, capture_output=True, text=True, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        shutil.rmtree(started_in)  # the notebook folder the cluster was started from is renamed or deleted
        yield {"env": env, "python": python, "home": home, "root": root}
    finally:
        subprocess.run([str(python), "-m", "nbtrain", "cluster", "stop"], env=env, capture_output=True, timeout=120)
        info = LocalClusterInfo.from_record(read_json(home / "cluster" / "local.json"))
        if info is not None:  # the stop above failed: end the head this module started, by its process group
            try:
                os.killpg(info.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(home, ignore_errors=True)


def _drive(cluster: dict[str, Any], code: str, cwd: Path) -> list[dict[str, Any]]:
    """Run ``code`` in a driver (a notebook's kernel) in ``cwd``; what it appended to ``answers``."""
    done = subprocess.run([str(cluster["python"]), "-c", DRIVER, code], cwd=cwd, env=cluster["env"],
                          capture_output=True, text=True, timeout=540)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ANSWER ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(lines[-1].removeprefix("ANSWER "))
    return answers


def test_the_cluster_starts_by_its_own_python_and_lives_in_a_folder_of_its_home(moved_cluster):
    home = moved_cluster["home"]
    info = LocalClusterInfo.from_record(read_json(home / "cluster" / "local.json"))
    assert info is not None and info.prefix == str(moved_cluster["root"] / "venv")
    head = psutil.Process(info.pid)
    assert head.cmdline()[:4] == [str(moved_cluster["python"]), "-m", "nbtrain._client.local.ray_head_process", "start"]
    folders, listening = set(), set()
    for process in [head, *head.children(recursive=True)]:
        try:
            folders.add(Path(process.cwd()))
            listening.update((process.pid, c.laddr.ip) for c in process.net_connections(kind="inet")
                             if c.status == psutil.CONN_LISTEN)
        except psutil.NoSuchProcess:  # a worker that ended meanwhile
            continue
    assert folders == {home / "cluster" / "cwd"}
    assert listening and all(_loopback(ip) for _pid, ip in listening), listening


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a gRPC server's IPv6 socket
    return (mapped or address).is_loopback


def test_ranks_write_relative_files_in_the_notebook_folder_or_else_the_run_folder(moved_cluster):
    root: Path = moved_cluster["root"]
    first, gone, third = root / "notebook-1", root / "notebook-gone", root / "notebook-3"
    for folder in (first, gone, third):
        folder.mkdir()
    answers = _drive(moved_cluster, f"""
answers.append(answer(nbtrain.launch(files_here, config={{"tag": "first"}}, workers=2)))
os.chdir({str(gone)!r}); os.rmdir({str(gone)!r})  # this notebook's folder goes before its next launch
answers.append(answer(nbtrain.launch(files_here, config={{"tag": "gone"}}, workers=2)))
os.chdir({str(third)!r})  # the warm workers of the runs before serve this one
answers.append(answer(nbtrain.launch(files_here, config={{"tag": "third"}}, workers=2)))
""", cwd=first)
    assert [a["state"] for a in answers] == ["succeeded"] * 3, answers
    assert answers[0]["result"] == [str(first)] * 2
    assert sorted(p.name for p in first.iterdir()) == ["rank0.txt", "rank1.txt"]
    assert (first / "rank1.txt").read_text() == "first"

    run_files = moved_cluster["home"] / "storage" / answers[1]["name"] / "files"
    assert answers[1]["result"] == [str(run_files)] * 2
    assert sorted(p.name for p in run_files.iterdir()) == ["rank0.txt", "rank1.txt"]

    assert answers[2]["result"] == [str(third)] * 2
    assert (third / "rank0.txt").read_text() == "third"
    assert (first / "rank0.txt").read_text() == "first", "a later run wrote into the first notebook's folder"


def test_a_rank_process_lost_while_starting_is_started_again(moved_cluster, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "one").touch()  # one rank process dies while starting
    answers = _drive(moved_cluster, f"""
run = nbtrain.launch(files_here, config={{"tag": "x"}}, workers=2, warm=False,
                     env={{{FAULT_START_EXIT_ENV!r}: {str(tokens)!r}}})
answers.append(answer(run))
""", cwd=tmp_path)
    (answer,) = answers
    assert answer["state"] == "succeeded", answer
    assert not list(tokens.iterdir())
    (said,) = answer["startup"]
    assert "worker process (pid " in said and "was lost while starting" in said, said
    assert "starting it again as a fresh process (1/2)" in said


def test_a_rank_lost_at_every_start_fails_the_run_with_its_own_last_log_lines(moved_cluster, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for index in range(8):  # more deaths than two ranks' three starts each
        (tokens / f"t{index}").touch()
    answers = _drive(moved_cluster, f"""
run = nbtrain.launch(files_here, config={{"tag": "x"}}, workers=2, warm=False,
                     env={{{FAULT_START_EXIT_ENV!r}: {str(tokens)!r}}})
answers.append(answer(run))
""", cwd=tmp_path)
    (answer,) = answers
    assert answer["state"] == "failed", answer
    error = answer["error"]
    assert "worker process was lost while starting, 3 times" in error, error
    assert "its last log lines are below" in error
    assert "nbtrain test fault: rank process" in error and f"exits while starting ({FAULT_START_EXIT_ENV})" in error
    assert any("(1/2)" in said for said in answer["startup"]) and any("(2/2)" in said for said in answer["startup"])
