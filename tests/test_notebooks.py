"""Every tutorial notebook in notebooks/ runs top to bottom as a user runs it: on the embedded cluster
nbtrain starts on this machine, sized by nbtrain as it sizes it for a user (the machine's real CPU
count, 2 on a laptop-sized box or Binder), not on the test session's roomier cluster.

Notebooks are found by glob, so a new notebook is executed without touching this file;
``SMALL`` shrinks the ones with a ``parameters`` cell (papermill) so the whole set takes
a few minutes on two CPU cores. Each runs under plain papermill in a process of its own
that never imported nbtrain, as a user's CI or VS Code would run it. The kernels share a home of
their own (``NBTRAIN_HOME``), so the first notebook's ``%ray_connect`` starts the embedded cluster
exactly as the README's first command does, and the next ones find it. They run one after the other,
as a user works through the tutorials: a notebook's two ranks take the whole cluster.
A failing cell fails its notebook's test with the cell's error and traceback; the executed notebook
is kept under pytest's tmp directory. A notebook that ran well is also copied to ``docs/_executed/``
(ignored by git), where the documentation build finds the outputs it shows (``docs/_ext/nbtrain_tutorials.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
EXECUTED_FOR_DOCS = NOTEBOOKS_DIR.parent / "docs" / "_executed"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 420
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# papermill parameters that make each notebook tiny (names from its `parameters` cell)
SMALL: dict[str, dict[str, object]] = {
    "01_quickstart.ipynb": {"epochs": 2},
    "02_cifar10_resnet18.ipynb": {"dataset_size": 32, "image_size": 8, "batch_size": 8, "epochs": 1,
                                  "max_steps_per_epoch": 2, "workers": 2, "gpus_per_worker": 0},
    "03_vit_cifar10_ray_data.ipynb": {"num_train": 1024, "num_valid": 256, "batch_size": 32, "epochs": 2},
    "04_launch_panel.ipynb": {"epochs": 1},
    "05_fault_tolerance.ipynb": {"steps": 40, "step_time": 0.25, "checkpoint_every": 4},
    "06_tune_asha.ipynb": {"num_samples": 2, "epochs": 2, "num_train": 256, "num_valid": 128, "batch_size": 32},
    "07_serve.ipynb": {"num_samples": 2, "epochs": 2, "num_train": 256},
    "08_lightning.ipynb": {"epochs": 2, "num_train": 1024, "batch_size": 64},
    "09_elastic.ipynb": {"steps": 400, "step_time": 0.05},
    "10_steer_and_compare.ipynb": {"batches": 10, "step_time": 0.05},
    "11_debug_and_profile.ipynb": {"steps": 12, "straggler_steps": 375, "straggler_window_s": 2.0},
}


def test_every_notebook_is_committed_without_outputs():
    import nbformat

    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOKS_DIR}"
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        dirty = [i for i, cell in enumerate(notebook.cells)
                 if cell.cell_type == "code" and (cell.outputs or cell.execution_count)]
        assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"
        # nbformat 4.5 cells carry an id; without one every reader warns (and future nbformat refuses)
        unnamed = [i for i, cell in enumerate(json.loads(path.read_text())["cells"]) if "id" not in cell]
        assert not unnamed, f"{path.name}: cells {unnamed} have no id; nbformat.validator.normalize() adds them"


class Executed:
    """One notebook run under papermill in its own process: how it ended, and the executed notebook."""

    def __init__(self, path: Path, workdir: Path, home: Path) -> None:
        self.path = path
        self.output = workdir / path.name
        params = workdir / "parameters.json"  # JSON is YAML: papermill's -f reads it
        params.write_text(json.dumps(SMALL.get(path.name, {})))
        env = _users_env(home)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "papermill", str(path), str(self.output), "-f", str(params),
             "--kernel", "python3", "--cwd", str(workdir), "--execution-timeout", str(CELL_TIMEOUT_S),
             "--no-progress-bar"],
            env=env, capture_output=True, text=True, timeout=CELL_TIMEOUT_S * 2)
        self.seconds = time.monotonic() - started
        self.returncode = done.returncode
        self.stderr = done.stderr

    def failure(self) -> str | None:
        """What went wrong, as a user would want it: the failing cell, its error and traceback, what it printed."""
        if self.returncode == 0:
            return None
        import nbformat

        try:
            notebook = nbformat.read(self.output, as_version=4)
        except (OSError, ValueError):
            return f"{self.path.name}: papermill failed before writing a notebook:\n{ANSI.sub('', self.stderr)[-4000:]}"
        for cell in notebook.cells:
            errors = [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]
            if cell.cell_type == "code" and errors:
                # a magic's UsageError reaches the notebook as printed text, not in the error itself
                printed = ANSI.sub("", "".join(out.get("text", "") for out in cell.outputs))[-4000:]
                return (f"{self.path.name}: cell {cell.get('execution_count')} raised {errors[0]['ename']}: "
                        f"{errors[0]['evalue']}\n{ANSI.sub('', chr(10).join(errors[0]['traceback']))}\n"
                        f"--- what the cell printed ---\n{printed}\n(executed notebook: {self.output})")
        return f"{self.path.name}: papermill exited {self.returncode}:\n{ANSI.sub('', self.stderr)[-4000:]}"


@pytest.fixture(scope="module")
def users_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home of the notebooks' own; its embedded cluster (started by the first notebook) is stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="nbt-user-"))  # short: Ray's socket paths live under it
    try:
        yield home
    finally:
        subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=_users_env(home),
                       capture_output=True, timeout=120, check=False)


def _users_env(home: Path) -> dict[str, str]:
    drop = {"RAY_ADDRESS", "RAY_ENABLE_AUTO_CONNECT"}  # the session's cluster; a user's kernel has neither
    return {**{key: value for key, value in os.environ.items() if key not in drop}, "NBTRAIN_HOME": str(home)}


def test_the_users_cluster_has_this_machines_cpus(users_home: Path):
    """What the notebooks run on: the embedded cluster, started with no size given (as the README's first
    command and a first ``%ray_connect`` start it), has this machine's CPUs. Runs first: the notebooks find it."""
    env = _users_env(users_home)
    started = subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "start"], env=env, capture_output=True,
                             text=True, timeout=300, check=False)
    assert started.returncode == 0, started.stderr[-3000:]
    status = subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "status"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert status.returncode == 0, status.stderr[-3000:]
    assert f"{len(os.sched_getaffinity(0))} CPU" in status.stdout, status.stdout


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, users_home: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]):
    executed = Executed(path, tmp_path, users_home)
    with capsys.disabled():
        print(f"\n[notebook] {path.name}: {executed.seconds:.1f} s")
    if (failure := executed.failure()) is not None:
        pytest.fail(failure, pytrace=False)
    EXECUTED_FOR_DOCS.mkdir(exist_ok=True)
    shutil.copyfile(executed.output, EXECUTED_FOR_DOCS / path.name)
