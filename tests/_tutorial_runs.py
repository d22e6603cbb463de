"""Running the tutorials as a user runs them, for the notebook tests and for ``scripts/refresh-tutorials``.

Both execute each notebook in ``notebooks/`` from its code alone (its committed outputs cleared), under
plain papermill in a process of its own that never imported nbtrain, with the ``SMALL`` parameters that
make the whole set take minutes on two CPU cores, in a shared home (``NBTRAIN_HOME``) whose embedded
cluster the first notebook's ``%ray_connect`` starts. The tests then check ``PROMISES``; the script also
writes the run's outputs back into the committed notebook (:func:`committed_form`), with a note where
papermill put the parameters and a stamp (:func:`stamp`) that ``tests/test_notebooks.py`` compares
with the notebook's code, so outputs older than their code fail the quick tier.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbtrain._client.warm import WARM_START_ENV

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 420
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP_KEY = "nbtrain_tutorial_run"  # in the notebook's metadata
NOTE_ID = "tutorial-run-note"  # the markdown cell that stands where papermill injected the parameters
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

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
    "12_torchrun_script.ipynb": {"epochs": 2},
}

# What each tutorial promises, as its cells print it: (pattern, check of every match, the promise in words).
# Each notebook asserts the same in a cell of its own, where a reader sees it; this reads the outcome back
# from the executed notebook, so a notebook that stops checking (or prints something else) fails.
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
         "CPUs with `gpus_per_worker=0`")],
    "03_vit_cifar10_ray_data.ipynb": [
        (r"final val_accuracy ([\d.]+)", _last_above(0.5), "the ViT learns: `val_accuracy` above 0.5")],
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
        (r"test accuracy ([\d.]+)", _last_above(0.3),
         "the best trial's model: test accuracy above 0.3, three times chance")],
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
        (r"epoch \d+: batch (\d+) per rank", lambda found: int(found[1]) > int(found[0]), "the adaptive batch grows")],
    "10_steer_and_compare.ipynb": [
        (r"before: ([\d.]+)  from then: ([\d.]+)", lambda found: found[-1] == ("0.05", "0.01"),
         "`adjust(lr=0.01)` applies from the step it returned"),
        (r"paused at step \d+; every rank: (.*)", lambda found: found[-1] == "['paused']", "every rank pauses"),
        (r"(\w+); last step \d+, checkpoint at step (\d+) \(asked at (\d+)\)",
         lambda found: found[-1][0] == "stopped" and int(found[-1][1]) >= int(found[-1][2]),
         "`checkpoint_now()` keeps a checkpoint, `stop(after='epoch')` stops the run"),
        (r"its first loss ([\d.]+); the parent's first loss ([\d.]+)", _first_below(0.25),
         "the fork's curve goes on from its parent's checkpoint"),
        (r"rewound to step (\d+) from step \d+, 2 batches passed over; the same processes: (\w+)",
         lambda found: found[-1] == ("40", "True"), "`rewind()` goes back to step 40 in the same processes"),
        (r"(\w+); (\d+) rows of the branch left are kept, marked superseded",
         lambda found: found[-1][0] == "succeeded" and int(found[-1][1]) > 0, "the branch left is kept, superseded"),
        (r"marked on the curves: (.*)", lambda found: "lr" in found[-1] and "patched" in found[-1],
         "`run.figure()` marks the learning rate's change and the patch")],
    "11_debug_and_profile.ipynb": [
        (r"loss is NaN at step (\d+)", lambda found: found[0] == "7", "the failing rank's error"),
        (r"(Rank \d+) is a straggler", lambda found: found == ["Rank 1"], "rank 1 is flagged as the straggler"),
        (r"rank 0's top operator over (\d+) steps", _last_above(0), "a profile of rank 0 with its trace")],
    "12_torchrun_script.ipynb": [
        (r"(\w+): final loss ([\d.]+) after (\d+) attempts",
         lambda found: found[-1][0] == "succeeded" and float(found[-1][1]) < 0.01 and found[-1][2] == "2",
         "the unchanged torchrun script trains, fails once, and attempt 2 resumes from its own snapshot"),
        (r"line magic: (\w+), (\d+) metric rows", lambda found: found[-1][0] == "succeeded" and int(found[-1][1]) > 0,
         "the line magic runs the script, with curves from its `SummaryWriter`"),
        (r"pasted script: (\w+)", lambda found: found[-1] == "succeeded", "a pasted script's `__main__` block runs")],
}


def users_env(home: Path) -> dict[str, str]:
    """This process's environment as a user's kernel has it: no session cluster, the notebooks' own home."""
    # the test session's cluster, and its kernels' warming turned off (tests/conftest.py): a user's kernel has none
    drop = {"RAY_ADDRESS", "RAY_ENABLE_AUTO_CONNECT", WARM_START_ENV}
    return {**{key: value for key, value in os.environ.items() if key not in drop}, "NBTRAIN_HOME": str(home)}


def start_cluster(home: Path) -> subprocess.CompletedProcess[str]:
    """Start the embedded cluster in ``home`` as ``nbtrain lab`` (the README's first command) does before a
    user's first notebook: the notebooks then reuse it, in the tests and on the committed pages alike."""
    return subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "start"], env=users_env(home),
                          capture_output=True, text=True, timeout=300, check=False)


def stop_cluster(home: Path) -> None:
    """Stop the embedded cluster the notebooks started in ``home`` (nothing to do when there is none)."""
    subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=users_env(home),
                   capture_output=True, timeout=120, check=False)


def code_sources(notebook: dict[str, Any]) -> list[str]:
    """The notebook's code cells as the user runs them: papermill's injected-parameters cell left out."""
    return ["".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for cell in notebook["cells"]
            if cell["cell_type"] == "code" and "injected-parameters" not in cell.get("metadata", {}).get("tags", [])]


def stamp(notebook: dict[str, Any], parameters: dict[str, object]) -> str:
    """What a refresh's outputs were made from: a hash of the code cells' sources and of the parameters."""
    made_from = json.dumps({"code": code_sources(notebook), "parameters": parameters}, sort_keys=True)
    return hashlib.sha256(made_from.encode()).hexdigest()


def cleared(notebook: dict[str, Any]) -> dict[str, Any]:
    """``notebook`` as its code alone: no outputs, counts, refresh note or stamp (what a fresh run starts from)."""
    notebook = copy.deepcopy(notebook)
    notebook["cells"] = [cell for cell in notebook["cells"] if cell.get("id") != NOTE_ID]
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    notebook.get("metadata", {}).pop(STAMP_KEY, None)
    notebook.get("metadata", {}).pop("widgets", None)
    return notebook


def note(parameters: dict[str, object]) -> dict[str, Any]:
    """The markdown cell that says which run the outputs below come from."""
    values = ", ".join(f"`{name} = {value!r}`" for name, value in parameters.items())
    said = ("*The outputs below come from a run of this notebook on a 2-CPU machine with smaller parameters "
            f"than the cell above: {values}. Run it yourself for the full sizes.*" if parameters else
            "*The outputs below come from a run of this notebook on a 2-CPU machine.*")
    said += " *Paths are shown as on a machine with nbtrain's default home, `~/.nbtrain`.*"
    return {"cell_type": "markdown", "id": NOTE_ID, "metadata": {}, "source": said}


def without_widgets(notebook: dict[str, Any]) -> dict[str, Any]:
    """``notebook`` without widget views and widget state: each dashboard output keeps its static picture,
    which every reader (JupyterLab without a kernel, GitHub, the site) draws, and the file stays small."""
    metadata = notebook.get("metadata", {})
    metadata.get("widgets", {}).pop(WIDGET_STATE, None)
    if not metadata.get("widgets"):
        metadata.pop("widgets", None)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            for out in cell.get("outputs", []):
                out.get("data", {}).pop(WIDGET_VIEW, None)
            cell["outputs"] = [out for out in cell.get("outputs", []) if "data" not in out or out["data"]]
    return notebook


def machine_paths(home: Path, workdir: Path) -> list[tuple[str, str]]:
    """The executing machine's own paths and what a reader's page says instead, longest first: the run's home
    as a user's default home, the folder papermill ran in as the notebooks' folder, Python's own folders."""
    import sysconfig

    import nbtrain

    paths = {str(home): "~/.nbtrain", str(workdir): "notebooks",
             sysconfig.get_paths()["purelib"]: "site-packages", sys.prefix: "python", str(Path.home()): "~",
             str(Path(nbtrain.__file__).resolve().parent.parent): "site-packages"}  # an editable install's checkout
    return sorted(paths.items(), key=lambda pair: -len(pair[0]))


def without_paths(text: str, paths: list[tuple[str, str]]) -> str:
    for path, shown in paths:
        text = text.replace(path, shown)
    return text


def _outputs_without_paths(notebook: dict[str, Any], paths: list[tuple[str, str]]) -> None:
    for cell in notebook["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = without_paths("".join(out["text"]), paths)
            if "traceback" in out:
                out["traceback"] = [without_paths(line, paths) for line in out["traceback"]]
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/"):
                    out["data"][kind] = without_paths("".join(value), paths)


def committed_form(executed: dict[str, Any], parameters: dict[str, object],
                   paths: list[tuple[str, str]]) -> dict[str, Any]:
    """The executed notebook as it is committed: the note instead of the injected parameters, no widgets,
    none of papermill's timings, no path of the machine that ran it (``paths``: :func:`machine_paths`), and
    the stamp of the code and parameters it ran."""
    notebook = without_widgets(copy.deepcopy(executed))
    _outputs_without_paths(notebook, paths)
    cells = []
    for cell in notebook["cells"]:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cells.append(note(parameters))
            continue
        metadata = cell.get("metadata", {})
        for key in ("papermill", "execution"):
            metadata.pop(key, None)
        if metadata.get("tags") == []:  # papermill gives every cell one
            metadata.pop("tags")
        cells.append(cell)
    notebook["cells"] = cells
    notebook["metadata"].pop("papermill", None)
    notebook["metadata"][STAMP_KEY] = {"sha256": stamp(notebook, parameters), "parameters": parameters,
                                       "made_by": "scripts/refresh-tutorials"}
    return notebook


class Executed:
    """One notebook run from its code under papermill in its own process: how it ended, the executed notebook."""

    def __init__(self, path: Path, workdir: Path, home: Path) -> None:
        self.path = path
        self.paths = machine_paths(home, workdir)
        self.parameters = SMALL.get(path.name, {})
        self.output = workdir / path.name
        source = workdir / f"cleared-{path.name}"
        source.write_text(json.dumps(cleared(json.loads(path.read_text(encoding="utf-8"))), indent=1),
                          encoding="utf-8")
        for folder in NOTEBOOKS_DIR.iterdir():  # what the notebooks find beside them (torchrun_script/)
            if folder.is_dir() and not folder.name.startswith("."):
                shutil.copytree(folder, workdir / folder.name, dirs_exist_ok=True)
        params = workdir / "parameters.json"  # JSON is YAML: papermill's -f reads it
        params.write_text(json.dumps(self.parameters))
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "papermill", str(source), str(self.output), "-f", str(params),
             "--kernel", "python3", "--cwd", str(workdir), "--execution-timeout", str(CELL_TIMEOUT_S),
             "--no-progress-bar"],
            env=users_env(home), capture_output=True, text=True, timeout=CELL_TIMEOUT_S * 2)
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


# What a page shows, compared with what the code prints now (test_notebooks.py): numbers, hex ids, a run name's
# "-N" and the spaces that align columns aside, since those differ from run to run, and the lines each notebook
# says vary.
NUMBER = re.compile(r"\b[0-9a-f]*\d[0-9a-f]*(?:[.,:]\d+)*\b|\d+(?:[.,:]\d+)*")  # 2.5 and 12 alike: #
RUN_NUMBER = re.compile(r"(?<=[A-Za-z])(?:-#)+(?:-[0-9a-f]{4}\b)?")  # a default name's time and random suffix
VARIES: dict[str, list[str]] = {
    # whether the elastic run saw the room to grow once or twice before it grew
    "09_elastic.ipynb": [r"room for # ranks \(now #\): growing at the next checkpoint"],
    # the sweep it serves: 06's when 06 ran first (the pages), else a tiny one of its own (the tests run 06 later)
    "07_serve.ipynb": [r"^found: "],
    # %ray_status lists every run of the home: the other notebooks' default-named runs, as many as ran before
    "05_fault_tolerance.ipynb": [r"^run (?:succeeded|failed|stopped|running) "],
    # which operator took most of rank 0's self time in 10 steps: allreduce or the optimizer's step
    "11_debug_and_profile.ipynb": [r"top operator over # steps: "],
}
# Ray's own notices ("(raylet) A worker died…" after a rank is killed) reach a cell when they reach it: not the
# code's printing, so not compared; nor are a notice's indented lines after its first ("…marked dead because the
# detector has missed too many heartbeats from it…" goes on with "\t(2) raylet has lagging heartbeats…" when a
# busy machine's killed node is found by its missed heartbeats rather than by its exit).
RAY_NOTICE = re.compile(r"^\((?:raylet|pid=#|\w+ pid=#)\)")


def shown_lines(notebook: dict[str, Any], name: str) -> dict[str, set[str]]:
    """Each code cell's printed lines (its id → the set of lines), as a reader of the page compares them:
    numbers as ``#``, no ``-N`` after a name, without the lines ``VARIES`` names."""
    varies = [re.compile(pattern) for pattern in VARIES.get(name, [])]
    shown = {}
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = set()
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text = ANSI.sub("", "".join(out["text"]))
            elif out.get("output_type") == "error":
                text = f"{out['ename']}: {out['evalue']}"
            else:
                continue
            in_notice = False
            for raw in text.splitlines():
                line = " ".join(RUN_NUMBER.sub("", NUMBER.sub("#", raw)).split())
                in_notice = bool(RAY_NOTICE.match(line)) or (in_notice and raw[:1].isspace())
                if line and not in_notice and not any(pattern.search(line) for pattern in varies):
                    lines.add(line)
        shown[cell.get("id", "")] = lines
    return shown


def drift(committed: dict[str, Any], executed: dict[str, Any], name: str) -> list[str]:
    """Where the page (``committed``) and what the code prints now (``executed``) differ, cell by cell."""
    page, now = shown_lines(committed, name), shown_lines(executed, name)
    differences = []
    for cell_id, lines in now.items():
        on_page = page.get(cell_id, set())
        for line in sorted(on_page - lines):
            differences.append(f"cell {cell_id}: the page shows {line!r}, which the code no longer prints")
        for line in sorted(lines - on_page):
            differences.append(f"cell {cell_id}: the code prints {line!r}, which the page does not show")
    return differences
