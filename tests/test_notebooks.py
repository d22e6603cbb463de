"""Every tutorial notebook in notebooks/ runs top to bottom against the session's loopback cluster.

Notebooks are found by glob, so a new notebook is executed without touching this file;
``SMALL`` shrinks the ones with a ``parameters`` cell (papermill) so the whole set takes
a few minutes on two CPU cores. The kernel inherits ``NBTRAIN_HOME`` from this process
(set by conftest.py), so ``%ray_connect`` with no address inside a notebook reuses the
session's cluster instead of starting another. A failing cell fails the test with the
cell's error and traceback; the executed notebook is kept under pytest's tmp_path.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import nbtrain

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 420
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# papermill parameters that make each notebook tiny (names from its `parameters` cell)
SMALL: dict[str, dict[str, object]] = {
    "01_quickstart.ipynb": {"epochs": 2},
    "02_cifar10_resnet18.ipynb": {"dataset_size": 32, "image_size": 8, "batch_size": 8, "epochs": 1,
                                  "max_steps_per_epoch": 2, "workers": 2, "gpus_per_worker": 0},
    "03_vit_cifar10_ray_data.ipynb": {"num_train": 256, "num_valid": 64, "batch_size": 32, "epochs": 1},
    "04_launch_panel.ipynb": {"epochs": 1},
    "05_fault_tolerance.ipynb": {"steps": 20, "step_time": 0.25, "checkpoint_every": 4},
    "06_tune_asha.ipynb": {"num_samples": 2, "epochs": 2, "num_train": 256, "num_valid": 128, "batch_size": 32},
    "07_serve.ipynb": {"num_samples": 2, "epochs": 2, "num_train": 256},
    "08_lightning.ipynb": {"epochs": 2, "num_train": 1024, "batch_size": 64},
    "09_elastic.ipynb": {"steps": 250, "step_time": 0.05},
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


def _printed_by_cell(executed: Path, execution_count: int) -> str:
    """A magic's UsageError reaches the notebook as printed text, not in the error itself."""
    import nbformat

    try:
        notebook = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return "(no executed notebook)"
    for cell in notebook.cells:
        if cell.cell_type == "code" and cell.get("execution_count") == execution_count:
            return ANSI.sub("", "".join(out.get("text", "") for out in cell.outputs))[-4000:]
    return ""


@pytest.fixture
def _no_leftover_runs(cluster):
    """A notebook that fails mid-run must not leave workers holding the cluster's CPUs."""
    yield
    for info in nbtrain.runs():
        if info["state"] in ("pending", "starting", "running", "restarting"):
            nbtrain.attach(info["name"]).stop()


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, cluster, _no_leftover_runs, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    import papermill

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the kernel must reach the session's cluster
    output = tmp_path / path.name
    started = time.monotonic()
    try:
        papermill.execute_notebook(
            str(path), str(output), parameters=SMALL.get(path.name, {}), kernel_name="python3",
            cwd=str(tmp_path), execution_timeout=CELL_TIMEOUT_S, progress_bar=False,
        )
    except papermill.PapermillExecutionError as exc:
        pytest.fail(f"{path.name}: cell {exc.exec_count} raised {exc.ename}: {exc.evalue}\n"
                    f"{ANSI.sub('', chr(10).join(exc.traceback))}\n"
                    f"--- what the cell printed ---\n{_printed_by_cell(output, exc.exec_count)}\n"
                    f"(executed notebook: {output})", pytrace=False)
    finally:
        with capsys.disabled():
            print(f"\n[notebook] {path.name}: {time.monotonic() - started:.1f} s")
