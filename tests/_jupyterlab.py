"""Start a real JupyterLab server for tests, and the Chromium flags that work here.

    lab = start_jupyterlab(tmp_path, env={"NBTRAIN_HOME": str(home)})
    page.goto(lab.lab_url("tree/demo.ipynb"))
    ...
    lab.stop()

Every server gets throwaway config/runtime/data/workspace directories, a
random token and a free port on 127.0.0.1; the nbtrain server extension is
enabled and the lab extension is served from this checkout
(``nbtrain/labextension``, built on demand with npm), so the tests see the
code under test whether or not nbtrain is pip-installed.

Browser test modules take Playwright's ``Page``, ``expect`` and
``PlaywrightTimeoutError`` from here: a machine without Playwright then still
collects the suite, and each browser test fails with the command that installs
it (:func:`browser_setup_problem`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # without Playwright the browser tests fail at setup (see browser_setup_problem), not the whole collection
    from playwright.sync_api import Page, expect
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
except ImportError:
    Page = expect = PlaywrightTimeoutError = None  # type: ignore[assignment,misc]

REPO = Path(__file__).resolve().parents[1]
LABEXTENSION_SRC = REPO / "labextension"
LABEXTENSION_BUILD = REPO / "nbtrain" / "labextension"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def browser_setup_problem() -> str | None:
    """Why the browser tests cannot run on this machine, with the command that fixes it; None if they can.

    tests/conftest.py turns this into an error for every ``browser`` test: a
    missing browser must fail the suite, never pass it by skipping.
    """
    missing = [name for name in ("playwright", "pytest_playwright") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"The browser tests need the Python packages {' and '.join(missing)}, which are not installed: "
                "run `pip install -e .[dev]` (or scripts/run-tests, which installs everything).")
    if not os.access(CHROMIUM, os.X_OK):
        return (f"The browser tests drive Debian's Chromium at {CHROMIUM}, which is not installed: run "
                "`apt-get install chromium` (Playwright cannot download its own browsers here).")
    return None


# Keep toasts and network look-ups out of the page under test.
_DISABLED_LAB_PLUGINS = {"@jupyterlab/apputils-extension:announcements": True}


PORT_TRIES = 3  # a free port can be taken by another process before the server binds it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _newest_mtime(paths: list[Path]) -> float:
    newest = 0.0
    for path in paths:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        newest = max([newest, *(p.stat().st_mtime for p in files)])
    return newest


def labextension_is_stale() -> bool:
    built = LABEXTENSION_BUILD / "package.json"
    if not built.exists():
        return True
    sources = [LABEXTENSION_SRC / name for name in ("src", "style", "package.json")]
    return _newest_mtime(sources) > built.stat().st_mtime


def ensure_labextension_built() -> Path:
    """Return the built lab extension, (re)building it with npm if needed.

    Raises ``RuntimeError`` when it must be built and npm is not installed.
    """
    if not labextension_is_stale():
        return LABEXTENSION_BUILD
    npm = shutil.which("npm")
    if npm is None:
        msg = (
            f"{LABEXTENSION_BUILD} is missing or older than labextension/src and npm is not "
            "installed; install Node.js >= 20 or run `pip install -e .` on a machine that has it."
        )
        raise RuntimeError(msg)
    for args in (["install", "--no-audit", "--no-fund"], ["run", "build:prod"]):
        subprocess.run([npm, *args], cwd=LABEXTENSION_SRC, check=True, capture_output=True, timeout=600)
    return LABEXTENSION_BUILD


@dataclass
class JupyterLab:
    """A running ``jupyter lab`` (or Notebook 7, ``app="notebook"``); stop it with :meth:`stop`."""

    url: str
    token: str
    port: int
    root_dir: Path
    log_path: Path
    env: dict[str, str]
    _proc: subprocess.Popen[bytes] = field(repr=False)
    _tmp: Path = field(repr=False)
    app: str = "lab"
    ipykernel: str = ""  # the version its notebooks' kernel runs, where a test chose it (kernel_env)

    def lab_url(self, path: str = "") -> str:
        """``/lab/<path>`` with the token, ready for ``page.goto``."""
        return f"{self.url}lab/{path}?token={self.token}"

    def notebook_url(self, notebook: str) -> str:
        """The page that opens ``notebook`` (relative to the root) in this server's app, with the token."""
        path = f"lab/tree/{notebook}" if self.app == "lab" else f"notebooks/{notebook}"
        return f"{self.url}{path}?token={self.token}"

    def api_url(self, path: str) -> str:
        return f"{self.url}{path.lstrip('/')}"

    def request(self, method: str, path: str, *, token: bool = True, body: Any = None) -> tuple[int, Any]:
        """One HTTP request to the server; returns (status, decoded JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api_url(path), method=method, data=data)
        if token:
            req.add_header("Authorization", f"token {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        shutil.rmtree(self._tmp, ignore_errors=True)


def start_jupyterlab(
    root_dir: str | os.PathLike[str],
    env: dict[str, str] | None = None,
    *,
    server_config: dict[str, Any] | None = None,
    from_checkout: bool = True,
    labextension: bool = True,
    python: str = sys.executable,
    timeout: float = 90.0,
    app: str = "lab",
) -> JupyterLab:
    """Start ``jupyter lab`` on 127.0.0.1 and wait until it answers.

    Args:
        root_dir: the server's root (notebooks are opened relative to it).
        env: extra environment variables (``NBTRAIN_HOME`` above all).
        server_config: extra traitlets config merged into the server's
            ``jupyter_server_config.json``, e.g. ``{"NbtrainServer": {...}}``.
        from_checkout: put this checkout first on ``PYTHONPATH``, so the
            server runs the code under test; False leaves it to what is
            installed for ``python``.
        labextension: with ``from_checkout``, also serve the checkout's built
            lab extension (building it first if it is stale).
        python: the interpreter that runs the server.
        timeout: seconds to wait for the server to answer.
        app: ``"lab"`` (JupyterLab) or ``"notebook"`` (Notebook 7, ``jupyter notebook``), which
            loads the same extensions; see :func:`start_notebook7`.
    """
    tmp = Path(tempfile.mkdtemp(prefix="nbtrain-lab-"))
    dirs = {name: tmp / name for name in ("config", "data", "runtime", "workspaces", "labextensions")}
    for path in dirs.values():
        path.mkdir()

    config: dict[str, Any] = {
        "ServerApp": {"jpserver_extensions": {"nbtrain._lab": True}},
        "NbtrainServer": {"refresh_interval": 0},
    }
    for section, values in (server_config or {}).items():
        config.setdefault(section, {}).update(values)
    (dirs["config"] / "jupyter_server_config.json").write_text(json.dumps(config))
    (dirs["config"] / "labconfig").mkdir()
    (dirs["config"] / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": _DISABLED_LAB_PLUGINS})
    )
    if from_checkout and labextension:
        (dirs["labextensions"] / "nbtrain").symlink_to(ensure_labextension_built())

    token = secrets.token_hex(16)
    full_env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    if from_checkout:
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env.update(env or {})
    module, app_class = {"lab": ("jupyterlab", "LabApp"), "notebook": ("notebook", "JupyterNotebookApp")}[app]
    command = [
        python,
        "-m",
        module,
        "--no-browser",
        "--ip=127.0.0.1",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        "--allow-root",
        f"--{app_class}.expose_app_in_browser=True",
        f"--{app_class}.workspaces_dir={dirs['workspaces']}",
        f"--{app_class}.extra_labextensions_path={dirs['labextensions']}",
    ]
    if app == "lab":
        command += [
            "--LabApp.news_url=None",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
    log_path = tmp / "jupyterlab.log"
    for _ in range(PORT_TRIES):
        port = free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*command, f"--port={port}"],
                cwd=root_dir,  # `python -m` puts the cwd first on sys.path: never the checkout by accident
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        lab = JupyterLab(
            url=f"http://127.0.0.1:{port}/",
            token=token,
            port=port,
            root_dir=Path(root_dir),
            log_path=log_path,
            env=full_env,
            _proc=proc,
            _tmp=tmp,
            app=app,
        )
        if _answers(lab, timeout):
            return lab
        # the port was free when picked; another process may have taken it before the server bound it
        if "already in use" not in lab.log():
            break
    text = lab.log()
    shutil.rmtree(tmp, ignore_errors=True)
    msg = f"jupyter lab exited with {proc.returncode} before answering:\n{text[-4000:]}"
    raise RuntimeError(msg)


def _answers(lab: JupyterLab, timeout: float) -> bool:
    """Wait until ``lab`` answers (True) or its process exits (False); past ``timeout``, stop it and raise."""
    deadline = time.monotonic() + timeout
    while True:
        if lab._proc.poll() is not None:
            return False
        try:
            status, _ = lab.request("GET", "api/status")
            if status == 200:
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            text = lab.log()
            lab.stop()
            msg = f"jupyter lab did not answer within {timeout:.0f} s:\n{text[-4000:]}"
            raise RuntimeError(msg)
        time.sleep(0.25)


def start_notebook7(root_dir: str | os.PathLike[str], env: dict[str, str] | None = None, **options: Any) -> JupyterLab:
    """Start Notebook 7 (``jupyter notebook``) as :func:`start_jupyterlab` starts JupyterLab."""
    return start_jupyterlab(root_dir, env, app="notebook", **options)


# Which ipykernel major a browser test's notebooks run: "this" interpreter's or the "other" one
# (scripts/ipykernel-venv's). Each test has its default (JupyterLab this one, Notebook 7 the other, so the suite
# covers both majors); NBTRAIN_BROWSER_IPYKERNEL swaps it, to time the controls under every pair (docs/running.md).
IPYKERNEL_CHOICE = "NBTRAIN_BROWSER_IPYKERNEL"


def other_ipykernel() -> str:
    """The folder that holds scripts/ipykernel-venv's ipykernel: 6 where this interpreter has 7 (made once)."""
    python = subprocess.run([str(REPO / "scripts" / "ipykernel-venv")], capture_output=True, text=True,
                            check=True).stdout.strip()
    return subprocess.run([python, "-c", "import ipykernel, os; print(os.path.dirname(os.path.dirname("
                                         "ipykernel.__file__)))"], capture_output=True, text=True,
                          check=True).stdout.strip()


def kernel_env(folder: Path, default: str) -> tuple[dict[str, str], str]:
    """The server's env for its notebooks' ``python3`` kernel to run this interpreter's ipykernel or the other
    major's (``$NBTRAIN_BROWSER_IPYKERNEL``, else ``default``), and that ipykernel's version.

    The other major's kernel is a spec under ``folder`` that runs this interpreter with that ipykernel first on its
    path: the session cluster refuses a kernel of another environment, so the interpreter stays this one."""
    choice = os.environ.get(IPYKERNEL_CHOICE, default)
    if choice not in ("this", "other"):
        raise ValueError(f"{IPYKERNEL_CHOICE}={choice!r}: say 'this' or 'other'")
    if choice == "this":
        import ipykernel

        return {}, ipykernel.__version__
    path = os.pathsep.join([other_ipykernel(), str(REPO)])
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (other ipykernel)", "language": "python", "env": {"PYTHONPATH": path}}))
    version = subprocess.run([sys.executable, "-c", "import ipykernel; print(ipykernel.__version__)"],
                             env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                             check=True).stdout.strip()
    return {"JUPYTER_PATH": str(folder)}, version

