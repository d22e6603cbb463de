"""The wheel carries the prebuilt lab extension: installed where no Node.js is
on PATH, JupyterLab lists the extension and the server extension as enabled
and OK, and the server answers on the nbtrain API.

The wheel is built once per session (npm runs during the build, so building
needs Node.js; using it does not). The venv borrows the heavy dependencies
(torch, Ray, JupyterLab) from the interpreter running the tests, but nbtrain
itself is installed from the wheel.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from _helpers import venv_with_these_packages
from _jupyterlab import REPO, ensure_labextension_built, start_jupyterlab

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    output = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{' '.join(command)} exited with {proc.returncode}:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("npm") is None and not (REPO / "nbtrain" / "labextension" / "package.json").exists():
        pytest.fail("building the wheel needs Node.js/npm (or a prebuilt nbtrain/labextension): install nodejs")
    ensure_labextension_built()  # so the wheel never ships a stale build
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(REPO)]
    if all(importlib.util.find_spec(name) for name in ("hatchling", "hatch_jupyter_builder")):
        command.append("--no-build-isolation")  # faster, and needs no package index
    run(command)
    (path,) = out.glob("nbtrain-*.whl")
    return path


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    root = venv_with_these_packages(tmp_path_factory.mktemp("venv"))
    python = root / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-index", str(wheel)])
    return root


@pytest.fixture
def env_without_node(venv: Path, tmp_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("JUPYTER", "PYTHON", "VIRTUAL_ENV", "NODE", "NPM"))
    }
    env.update(
        PATH=str(venv / "bin"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_PLATFORM_DIRS="1",
        NBTRAIN_HOME=str(tmp_path / "home"),
    )
    assert shutil.which("node", path=env["PATH"]) is None
    assert shutil.which("npm", path=env["PATH"]) is None
    return env


def test_wheel_ships_the_prebuilt_extension_and_the_enable_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    data = "nbtrain-0.1.0.data/data/"
    assert f"{data}share/jupyter/labextensions/nbtrain/package.json" in names
    assert f"{data}share/jupyter/labextensions/nbtrain/static/style.js" in names
    assert f"{data}share/jupyter/labextensions/nbtrain/install.json" in names
    assert f"{data}etc/jupyter/jupyter_server_config.d/nbtrain.json" in names
    assert "nbtrain/_lab/handlers.py" in names
    assert not [name for name in names if name.startswith("nbtrain/labextension/")]  # shipped once, as data


def test_nbtrain_comes_from_the_wheel(venv: Path, env_without_node: dict[str, str]) -> None:
    location = run(
        [str(venv / "bin" / "python"), "-c", "import nbtrain._lab; print(nbtrain.__file__)"],
        env=env_without_node,
        cwd=venv,  # not the checkout, which `python -c` would put first on sys.path
    )
    assert location.strip().startswith(str(venv))


def test_labextension_is_enabled_and_ok_without_node(venv: Path, env_without_node: dict[str, str]) -> None:
    output = run([str(venv / "bin" / "python"), "-m", "jupyterlab.labextensions", "list"],
                 env=env_without_node, cwd=venv)
    assert re.search(r"^\s*nbtrain v0\.1\.0 enabled\s+OK", output, re.MULTILINE), output
    assert str(venv / "share" / "jupyter" / "labextensions") in output


def test_server_extension_is_enabled_and_ok_without_node(venv: Path, env_without_node: dict[str, str]) -> None:
    output = run(
        [str(venv / "bin" / "python"), "-m", "jupyter_server.extension.serverextension", "list"],
        env=env_without_node,
        cwd=venv,
    )
    assert re.search(r"^\s*nbtrain\._lab\s+enabled", output, re.MULTILINE), output
    assert re.search(r"^\s*nbtrain\._lab\s+OK", output, re.MULTILINE), output


def test_installed_server_serves_the_extension_and_the_api(
    venv: Path, env_without_node: dict[str, str], tmp_path: Path
) -> None:
    lab = start_jupyterlab(
        tmp_path,
        env=env_without_node,
        server_config={"ServerApp": {"jpserver_extensions": {}}},  # only what the wheel installed
        from_checkout=False,
        python=str(venv / "bin" / "python"),
    )
    try:
        status, page = lab.request("GET", f"lab?token={lab.token}", token=False)
        assert status == 200
        assert re.search(r'"name":\s*"nbtrain"', page), "the lab page does not load the nbtrain extension"
        status, body = lab.request("GET", "nbtrain/api/runs")
        assert (status, body["runs"]) == (200, [])
        assert lab.request("GET", "nbtrain/api/runs", token=False)[0] == 403
    finally:
        lab.stop()
