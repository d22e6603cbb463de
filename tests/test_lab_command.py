"""``nbtrain lab``, as a newcomer runs it: Jupyter options pass through, root works, SIGTERM stops everything.

``$RAY_ADDRESS`` names a cluster here, so ``nbtrain lab`` starts no local one
(nothing listens there; no notebook connects in this test).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from nbtrain._client.entry import cli, launch
from nbtrain._client.entry.cli import jupyter_ip
from nbtrain._client.local import local_cluster
from nbtrain._exceptions import InvalidOptionError
from nbtrain._net import port_is_open

from _helpers import wait_for
from _jupyterlab import REPO, free_port

pytestmark = pytest.mark.quick


def lab_answers(port: int, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def command_line(process: psutil.Process) -> str:
    """``process``'s command line, or "" for one that ended (or is a zombie) while the test looked.

    JupyterLab starts short-lived helpers of its own; one may end between
    ``children()`` and ``cmdline()``.
    """
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def still_running(process: psutil.Process) -> bool:
    """Whether ``process`` runs (a zombie has ended; it waits only for its parent to read its status)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_lab_passes_jupyter_options_starts_as_root_and_stops_with_its_kernels_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "demo.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    dirs = {name: tmp_path / name for name in ("config", "data", "runtime", "home")}
    for path in dirs.values():
        path.mkdir()
    env = {
        **os.environ, "NBTRAIN_HOME": str(dirs["home"]), "RAY_ADDRESS": "ray://127.0.0.1:1",
        "JUPYTER_CONFIG_DIR": str(dirs["config"]), "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    port, token = free_port(), secrets.token_hex(16)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nbtrain", "lab", "--port", str(port), "--no-browser", "--port-retries=0",
         f"--IdentityProvider.token={token}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "demo.ipynb"],
        cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    lab = psutil.Process(proc.pid)
    try:
        wait_for(lambda: proc.poll() is not None or lab_answers(port, token), timeout=60,
                 message="JupyterLab to answer on the --port given")
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/kernels?token={token}", method="POST",
                                         data=b"{}")
        urllib.request.urlopen(request, timeout=30).close()
        kernel = wait_for(lambda: next((p for p in lab.children(recursive=True)
                                        if "ipykernel" in command_line(p)), None),
                          timeout=30, message="the kernel process")
        family = [lab, *lab.children(recursive=True)]
        assert kernel in family

        proc.send_signal(signal.SIGTERM)

        proc.wait(timeout=30)
        wait_for(lambda: not any(still_running(p) for p in family),
                 timeout=15, message="JupyterLab and its kernel to exit",
                 describe=lambda: [command_line(p)[:80] for p in family if p.is_running()])
        assert not port_is_open("127.0.0.1", port)
        said = proc.stdout.read().decode() if proc.stdout else ""
        assert "$RAY_ADDRESS=ray://127.0.0.1:1" in said
        if os.geteuid() == 0:
            assert said.count("Running as root") == 1, said
    finally:
        for process in [lab, *(lab.children(recursive=True) if lab.is_running() else [])]:
            if process.is_running():
                process.kill()


def test_stop_of_a_run_whose_record_names_no_cluster_starts_no_local_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NBTRAIN_HOME", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "nowhere.json").write_text('{"name": "nowhere", "state": "running"}')
    monkeypatch.setattr(local_cluster, "start", lambda *args, **kwargs: pytest.fail("a local cluster was started"))

    assert cli.main(["stop", "nowhere"]) == 2

    said = capsys.readouterr().err
    assert "The registry does not say which cluster runs 'nowhere'" in said
    assert "nbtrain stop nowhere --address ray://HOST:10001 (or HOST:6379, or auto, on a node of the cluster" in said


def test_runs_skips_and_names_runs_whose_names_nbtrain_never_makes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Head:  # a remote cluster, as much of it as `nbtrain runs` asks
        address, kind = "ray://head:10001", "remote"

        def nodes(self) -> list[dict[str, Any]]:
            return [{"alive": True}]

        def resources(self) -> dict[str, tuple[float, float]]:
            return {"CPU": (0.0, 8.0)}

    names = ["cifar", "{__import__('os').system('id')}", "../../etc/cron.d/x", "-rf"]
    monkeypatch.setattr(launch, "run_summaries", lambda: [{"name": name, "state": "running"} for name in names])
    # the fake head has no warm pools or sweeps to ask (the real ones need a connection this test does not make)
    monkeypatch.setattr(cli, "_warm_summary", lambda: {"idle": 0, "busy": 0, "next_exit_s": None})
    monkeypatch.setattr(cli, "sweep_records", lambda address: [])

    answer = cli.cluster_answer(Head())  # type: ignore[arg-type]

    assert [run["name"] for run in answer["runs"]] == ["cifar"]
    said = capsys.readouterr().err
    for name in names[1:]:
        assert f"skipped a run named {name!r} on ray://head:10001" in said



@pytest.mark.parametrize(("given", "ip", "rest"), [
    (["demo.ipynb", "--port", "9999"], "127.0.0.1", ["demo.ipynb", "--port", "9999"]),
    (["notebooks/01_quickstart.ipynb", "--ip", "127.0.0.1"], "127.0.0.1", ["notebooks/01_quickstart.ipynb"]),
    (["--ip=0.0.0.0", "--no-browser"], "0.0.0.0", ["--no-browser"]),
    (["--ServerApp.ip", "::1"], "::1", []),
])
def test_lab_passes_the_users_ip_once(given, ip, rest):
    """Jupyter refused `nbtrain lab NB --ip 127.0.0.1` ("only accepts one value, got 2") after the cluster started."""
    assert jupyter_ip(given) == (ip, rest)


def test_an_ip_flag_without_an_address_is_refused_before_anything_starts():
    with pytest.raises(InvalidOptionError, match=r"--ip needs an address, e.g. --ip=127.0.0.1"):
        jupyter_ip(["--ip", "--no-browser"])
