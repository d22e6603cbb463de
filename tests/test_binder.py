"""The Binder setup works: repo2docker's steps, reproduced without Docker.

repo2docker installs ``binder/requirements.txt``, runs ``binder/postBuild`` once, then
starts every container through ``binder/start`` with the notebook server as its command.
Here: a fresh venv made ``--without-pip`` that sees the packages of the interpreter running
the tests (so torch, Ray, JupyterLab and pip itself come from there and nothing is downloaded;
pip finds every requirement already satisfied), the requirements installed into it, postBuild run in it with
``NBTRAIN_PIP_INSTALL_ARGS="--no-build-isolation --no-deps ."`` (nbtrain is built from this
checkout with the system's build backend, no package index needed; on Binder it is a plain
``pip install .``), then ``binder/start`` running ``python -m nbconvert --execute`` on
01_quickstart.ipynb with a fresh NBTRAIN_HOME. The notebook must connect through the
RAY_ADDRESS that start exports, and the cluster start began must be gone once the command
exits (no process left in its process group, its client port closed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from nbtrain._net import LOOPBACK, port_is_open

from _helpers import venv_with_these_packages

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(command: list[str], env: dict[str, str], timeout: float, cwd: Path = REPO) -> str:
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    output = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{' '.join(command)} exited with {proc.returncode}:\n{output[-6000:]}"
    return output


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A venv built the way Binder builds its image: requirements.txt, then postBuild."""
    root = tmp_path_factory.mktemp("binder-venv")
    # No pip of its own: the test interpreter's runs in it. ensurepip's bundled setuptools (65 on Python 3.11) would
    # shadow the system's, and pip would fetch a newer one for torch (>=77), retrying each index it cannot reach.
    venv_with_these_packages(root, with_pip=False)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RAY_", "NBTRAIN_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(PATH=f"{root / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(root),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run(["python", "-m", "pip", "install", "-r", "binder/requirements.txt"], env, timeout=600)
    _run(["bash", "binder/postBuild"], {**env, "NBTRAIN_PIP_INSTALL_ARGS": "--no-build-isolation --no-deps ."},
         timeout=900)
    return env


@pytest.mark.notebook
@pytest.mark.timeout(1200)
def test_postbuild_installs_nbtrain_into_the_venv(binder_env: dict[str, str], tmp_path: Path):
    # (not from the repository root, where `import nbtrain` would find the checkout itself)
    out = _run(["python", "-c", "import nbtrain, sys; print(nbtrain.__file__, sys.prefix)"], binder_env, 60,
               cwd=tmp_path)
    location, prefix = out.split()
    assert prefix == binder_env["VIRTUAL_ENV"]
    assert Path(location).is_relative_to(prefix), f"nbtrain imported from {location}, not from the venv"


@pytest.mark.notebook
@pytest.mark.timeout(1200)
def test_start_runs_the_quickstart_and_stops_its_cluster(binder_env: dict[str, str], tmp_path: Path):
    home = tmp_path / "nbtrain-home"
    report = tmp_path / "seen-by-command.json"
    executed = tmp_path / "01_quickstart.executed.ipynb"
    # What the command sees: the exported address and the cluster's state, then the notebook run.
    command = (
        f"python -c 'import json, os; json.dump({{\"address\": os.environ[\"RAY_ADDRESS\"], "
        f"\"cluster\": json.load(open(os.environ[\"NBTRAIN_HOME\"] + \"/cluster/local.json\"))}}, "
        f"open(\"{report}\", \"w\"))' && "
        f"python -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600 "
        f"--output-dir {tmp_path} --output {executed.name} notebooks/01_quickstart.ipynb"
    )
    env = {**binder_env, "NBTRAIN_HOME": str(home)}
    started = time.monotonic()
    output = _run(["bash", "binder/start", "bash", "-c", command], env, timeout=1100)
    print(f"binder/start + 01_quickstart: {time.monotonic() - started:.1f} s")

    seen = json.loads(report.read_text())
    cluster = seen["cluster"]
    assert seen["address"] == f"{LOOPBACK}:{cluster['gcs_port']}"  # kernels join it as Ray drivers
    assert executed.exists(), output[-3000:]
    assert "local Ray cluster stopped" in output, output[-3000:]
    deadline = time.monotonic() + 30
    while _group_alive(cluster["pid"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(cluster["pid"]), f"processes of the cluster's group {cluster['pid']} outlived start"
    assert not port_is_open(LOOPBACK, cluster["client_port"]), "the cluster's Ray Client port is still open"
    assert not (home / "cluster" / "local.json").exists()
