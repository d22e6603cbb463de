"""Every tutorial notebook in notebooks/ runs top to bottom as a user runs it: on the embedded cluster
nbtrain starts on this machine, sized by nbtrain as it sizes it for a user (the machine's real CPU
count, 2 on a laptop-sized box or Binder), not on the test session's roomier cluster.

Notebooks are found by glob, so a new notebook is executed without touching this file (its promise
in ``PROMISES`` is asked for);
``SMALL`` shrinks the ones with a ``parameters`` cell (papermill) so the whole set takes
a few minutes on two CPU cores. Each runs under plain papermill in a process of its own
that never imported nbtrain, as a user's CI or VS Code would run it. The kernels share a home of
their own (``NBTRAIN_HOME``), so the first notebook's ``%ray_connect`` starts the embedded cluster
exactly as the README's first command does, and the next ones find it. They run one after the other,
as a user works through the tutorials: a notebook's two ranks take the whole cluster.
A failing cell fails its notebook's test with the cell's error and traceback; the executed notebook
is kept under pytest's tmp directory. Running is not enough: each tutorial's last cells check what its text
promises (an accuracy floor, the sweep's best trial better than its worst, the served model answering…) with
an ``assert`` the reader sees, and ``PROMISES`` reads the same outcomes back from what the cells printed.
A notebook that ran well is also copied to ``docs/_executed/`` (ignored by git), where the documentation
build finds the outputs it shows (``docs/_ext/nbtrain_tutorials.py``).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    "04_launch_panel.ipynb": {"epochs": 2},
    "05_fault_tolerance.ipynb": {"steps": 40, "step_time": 0.25, "checkpoint_every": 4},
    "06_tune_asha.ipynb": {"num_samples": 1, "epochs": 2, "num_train": 1024, "num_valid": 256, "batch_size": 32},
    "07_serve.ipynb": {"num_samples": 2, "epochs": 2, "num_train": 256},
    "08_lightning.ipynb": {"epochs": 2, "num_train": 1024, "batch_size": 64},
    "09_elastic.ipynb": {"steps": 400, "step_time": 0.05},
    "10_steer_and_compare.ipynb": {"batches": 10, "step_time": 0.05},
    "11_debug_and_profile.ipynb": {"steps": 12, "straggler_steps": 375, "straggler_window_s": 2.0},
    # papermill runs each notebook in a folder of its own: the script is named by its path
    "12_torchrun_script.ipynb": {"script": str(NOTEBOOKS_DIR / "torchrun_script" / "train.py"), "epochs": 2},
}

# What each tutorial promises, as its cells print it: (pattern, check of every match, the promise in words).
# Each notebook asserts the same in a cell of its own, where a reader sees it; this reads the outcome back
# from the executed notebook, so a notebook that stops checking (or prints something else) fails here.
Promise = tuple[str, Callable[[list[Any]], bool], str]


def _last_above(floor: float) -> Callable[[list[Any]], bool]:
    return lambda found: float(found[-1]) > floor


def _first_below(fraction: float) -> Callable[[list[Any]], bool]:
    """The last match's first number under ``fraction`` of its second."""
    return lambda found: float(found[-1][0]) < fraction * float(found[-1][1])


def _sizes(found: list[Any]) -> list[int]:
    return [int(n) for n in found[-1].split(",")]


PROMISES: dict[str, list[Promise]] = {
    "01_quickstart.ipynb": [
        (r"test MSE ([\d.]+) \(predicting the mean: ([\d.]+)\)", _first_below(0.5),
         "the trained MLP's test MSE is under half of predicting the mean's")],
    "02_cifar10_resnet18.ipynb": [
        (r"epoch \d+: val_accuracy [\d.]+ ", lambda found: len(found) == SMALL["02_cifar10_resnet18.ipynb"]["epochs"],
         "one validation accuracy per epoch"),
        (r"checkpoint of epoch (\d+) loaded",
         lambda found: int(found[-1]) == int(str(SMALL["02_cifar10_resnet18.ipynb"]["epochs"])) - 1,
         "the last epoch's checkpoint loads into a plain ResNet18"),
        (r"devices: \[(.*)\]", lambda found: "cpu" in found[-1] and "cuda" not in found[-1],
         "CPUs with gpus_per_worker=0")],
    "03_vit_cifar10_ray_data.ipynb": [
        (r"final val_accuracy ([\d.]+)", _last_above(0.5), "the ViT learns: val_accuracy above 0.5")],
    "04_launch_panel.ipynb": [
        (r"-> (\w+)\n", lambda found: found[-1] == "succeeded", "the panel's run succeeds"),
        (r"mean of the first 5 steps ([\d.]+), of the last 5 ([\d.]+)",
         lambda found: float(found[-1][1]) < float(found[-1][0]) / 2, "the panel's run trains: its loss halves")],
    "05_fault_tolerance.ipynb": [
        (r"final state: (\w+) after (\d+) attempts", lambda found: found[-1] == ("succeeded", "2"),
         "the run restarts once after the kill and succeeds"),
        (r"attempt 2: rank 0 reported steps (\d+)\.\.(\d+)",
         lambda found: int(found[-1][0]) > 1 and found[-1][1] == str(SMALL["05_fault_tolerance.ipynb"]["steps"]),
         "attempt 2 resumes from the checkpoint and finishes every step"),
        (r"(\d+) metric rows after reattaching \((\d+) before\)", lambda found: found[-1][0] == found[-1][1],
         "reattached, the run has its whole history")],
    "06_tune_asha.ipynb": [
        (r"best trial's loss ([\d.]+) .*, worst trial's ([\d.]+)", _first_below(1.0),
         "the sweep's best trial is better than its worst"),
        (r"test accuracy ([\d.]+)", _last_above(0.5), "the best trial's model: test accuracy above 0.5")],
    "07_serve.ipynb": [
        (r"served: (\[.*\])\nhere: +(\[.*\])",
         lambda found: found[-1][0] == found[-1][1] and found[-1][0].count(",") == 7,
         "the served model answers all 8 images, as the checkpoint's model does here")],
    "08_lightning.ipynb": [
        (r"test accuracy ([\d.]+)", _last_above(0.5), "the Lightning classifier: test accuracy above 0.5")],
    "09_elastic.ipynb": [
        (r"world size by attempt: \[([\d, ]+)\]",
         lambda found: _sizes(found)[0] == 1 and 2 in _sizes(found) and _sizes(found)[-1] == 1,
         "the elastic run starts on 1 rank, grows to 2 and shrinks back to 1"),
        (r"run \S+: (\w+)\n", lambda found: found[0] == "succeeded", "the elastic run succeeds"),
        (r"epoch \d+: batch (\d+) per rank", lambda found: int(found[-1]) > int(found[0]), "the adaptive batch grows")],
    "10_steer_and_compare.ipynb": [
        (r"before: ([\d.]+)  from then: ([\d.]+)", lambda found: found[-1] == ("0.05", "0.01"),
         "adjust(lr=0.01) applies from the step it returned"),
        (r"paused at step \d+; every rank: (.*)", lambda found: found[-1] == "['paused']", "every rank pauses"),
        (r"(\w+); last step \d+, checkpoint at step (\d+) \(asked at (\d+)\)",
         lambda found: found[-1][0] == "stopped" and int(found[-1][1]) >= int(found[-1][2]),
         "checkpoint_now() keeps a checkpoint, stop(after='epoch') stops the run"),
        (r"its first loss ([\d.]+); the parent's first loss ([\d.]+)", _first_below(0.25),
         "the fork's curve goes on from its parent's checkpoint")],
    "11_debug_and_profile.ipynb": [
        (r"loss is NaN at step (\d+)", lambda found: found[0] == "7", "the failing rank's error"),
        (r"(Rank \d+) is a straggler", lambda found: found == ["Rank 1"], "rank 1 is flagged as the straggler"),
        (r"rank 0's top operator over (\d+) steps", _last_above(0), "a profile of rank 0 with its trace")],
    "12_torchrun_script.ipynb": [
        (r"(\w+): final loss ([\d.]+) after (\d+) attempts",
         lambda found: found[-1][0] == "succeeded" and float(found[-1][1]) < 0.01 and found[-1][2] == "2",
         "the unchanged torchrun script trains, fails once, and attempt 2 resumes from its own snapshot"),
        (r"line magic: (\w+), (\d+) metric rows", lambda found: found[-1][0] == "succeeded" and int(found[-1][1]) > 0,
         "the line magic runs the script, with curves from its SummaryWriter"),
        (r"pasted script: (\w+)", lambda found: found[-1] == "succeeded", "a pasted script's __main__ block runs")],
}


def test_every_tutorial_states_its_promise():
    assert set(PROMISES) == {path.name for path in NOTEBOOKS}, "add the new notebook's promise to PROMISES"


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

    def printed(self) -> str:
        """What the executed notebook's cells printed (stdout and stderr), in order."""
        import nbformat

        notebook = nbformat.read(self.output, as_version=4)
        return ANSI.sub("", "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                                    for out in cell.outputs if out.get("output_type") == "stream"))

    def broken_promises(self) -> list[str]:
        """The promises of :data:`PROMISES` that what the notebook printed does not keep."""
        printed = self.printed()
        broken = []
        for pattern, check, promise in PROMISES[self.path.name]:
            found = re.findall(pattern, printed)
            if not found or not check(found):
                broken.append(f"{promise}: {pattern!r} found {found[-3:] if found else 'nothing'}")
        return broken


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
    if broken := executed.broken_promises():
        pytest.fail(f"{path.name} ran but does not keep its promises (executed notebook: {executed.output}):\n  "
                    + "\n  ".join(broken), pytrace=False)
    EXECUTED_FOR_DOCS.mkdir(exist_ok=True)
    shutil.copyfile(executed.output, EXECUTED_FOR_DOCS / path.name)


def _numbered(name: str, base: str) -> int:
    """1 for ``base`` itself, N for ``base-N``: which launch of the name a run or sweep was."""
    assert name == base or re.fullmatch(rf"{re.escape(base)}-\d+", name), f"{name!r} is not {base!r} or {base}-N"
    return 1 if name == base else int(name.rsplit("-", 1)[1])


def _on_the_cluster(home: Path) -> dict[str, str]:
    """Every run's and sweep's state on the notebooks' cluster, as ``nbtrain runs --json --live`` says it."""
    done = subprocess.run([sys.executable, "-m", "nbtrain", "runs", "--json", "--live"], env=_users_env(home),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    return {**{run["name"]: run["state"] for run in answer["runs"]},
            **{f"sweep {sweep['name']}": sweep["state"] for sweep in answer.get("sweeps", [])}}


@pytest.mark.notebook
@pytest.mark.timeout(1800)
def test_a_tutorial_runs_again(users_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """*Run All* twice in a row on the same cluster: the second time a notebook launches its names again, and
    each new run or sweep is the next ``NAME-N`` while the first time's are kept as they ended. Notebook 10
    launches ``steered``, forks it and compares the two (by their ``Run`` objects); 06 sweeps as ``mnist-asha``."""
    shown = {"06_tune_asha.ipynb": r"sweep (mnist-asha\S*): (\w+),",
             "10_steer_and_compare.ipynb": r"(\S+) forked from (\S+) at step"}
    for name, pattern in shown.items():
        seen = []
        for turn in (1, 2):
            workdir = tmp_path / f"{Path(name).stem}-{turn}"
            workdir.mkdir()
            executed = Executed(NOTEBOOKS_DIR / name, workdir, users_home)
            with capsys.disabled():
                print(f"\n[notebook] {name}, run {turn}: {executed.seconds:.1f} s")
            if (failure := executed.failure()) is not None:
                pytest.fail(f"run {turn}: {failure}", pytrace=False)
            if broken := executed.broken_promises():
                pytest.fail(f"run {turn} of {name} breaks its promises:\n  " + "\n  ".join(broken), pytrace=False)
            seen.append(re.findall(pattern, executed.printed())[-1])
        (first, first_other), (second, second_other) = seen
        on_cluster = _on_the_cluster(users_home)
        if name.startswith("06"):
            assert _numbered(second, "mnist-asha") == _numbered(first, "mnist-asha") + 1, seen
            assert first_other == second_other == "succeeded"
            assert on_cluster[f"sweep {first}"] == on_cluster[f"sweep {second}"] == "succeeded", on_cluster
        else:  # (fork, parent): the fork is named after its parent, so it is new too
            assert _numbered(second_other, "steered") == _numbered(first_other, "steered") + 1, seen
            assert (first, second) == (f"{first_other}-no-momentum", f"{second_other}-no-momentum")
            assert {on_cluster[run] for run in (first, first_other, second, second_other)} == {"stopped"}, on_cluster
