"""Every tutorial notebook in notebooks/ runs top to bottom as a user runs it: on the embedded cluster
nbtrain starts on this machine, sized by nbtrain as it sizes it for a user (the machine's real CPU
count, 2 on a laptop-sized box or Binder), not on the test session's roomier cluster.

Notebooks are found by glob, so a new notebook is executed without touching this file (its promise
in ``PROMISES`` is asked for). How a notebook is run is ``tests/_tutorial_runs.py``, shared with
``scripts/refresh-tutorials``: from its code alone (the committed outputs cleared), under plain papermill
in a process of its own that never imported nbtrain, as a user's CI or VS Code would run it, with the
``SMALL`` parameters that make the whole set take minutes on two CPU cores. The kernels share a home of
their own (``NBTRAIN_HOME``), so the first notebook's ``%ray_connect`` starts the embedded cluster
exactly as the README's first command does, and the next ones find it. They run one after the other,
as a user works through the tutorials: a notebook's two ranks take the whole cluster.
A failing cell fails its notebook's test with the cell's error and traceback; the executed notebook
is kept under pytest's tmp directory. Running is not enough: each tutorial's last cells check what its text
promises (an accuracy floor, the sweep's best trial better than its worst, the served model answering…) with
an ``assert`` the reader sees, and ``PROMISES`` reads the same outcomes back from what the cells printed.

The notebooks are committed with the outputs of such a run (what GitHub and the documentation site show);
the quick ``test_every_notebook_is_committed_with_outputs_of_its_code`` fails when they are older than
their code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _tutorial_runs import (
    NOTEBOOKS,
    NOTEBOOKS_DIR,
    PROMISES,
    SMALL,
    STAMP_KEY,
    Executed,
    committed_form,
    drift,
    stamp,
    start_cluster,
    stop_cluster,
    users_env,
)


def test_every_tutorial_states_its_promise():
    assert set(PROMISES) == {path.name for path in NOTEBOOKS}, "add the new notebook's promise to PROMISES"


@pytest.mark.quick
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_every_notebook_is_committed_with_outputs_of_its_code(path: Path):
    """What a reader sees under each cell (on GitHub, on the site) came from running the code above it, with
    the parameters the note names: the stamp ``scripts/refresh-tutorials`` wrote is the hash of the code cells
    and parameters it ran, so any edit to a code cell (or to ``SMALL``) without a refresh fails here."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    made = notebook.get("metadata", {}).get(STAMP_KEY)
    assert made is not None, f"{path.name} has no outputs from a run: run scripts/refresh-tutorials {path.stem}"
    assert made["sha256"] == stamp(notebook, SMALL.get(path.name, {})), (
        f"{path.name}: its code or parameters changed since its outputs were made: "
        f"run scripts/refresh-tutorials {path.stem}")
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert all(cell["execution_count"] for cell in code), f"{path.name}: a cell was not run"
    assert code[-1]["outputs"], f"{path.name}: its last cell shows nothing: run scripts/refresh-tutorials {path.stem}"
    errors = [cell["execution_count"] for cell in code if any(out["output_type"] == "error" for out in cell["outputs"])]
    assert not errors, f"{path.name}: cells {errors} show an error"
    # nbformat 4.5 cells carry an id; without one every reader warns (and future nbformat refuses)
    unnamed = [i for i, cell in enumerate(notebook["cells"]) if "id" not in cell]
    assert not unnamed, f"{path.name}: cells {unnamed} have no id; nbformat.validator.normalize() adds them"


@pytest.fixture(scope="module")
def users_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home of the notebooks' own; its embedded cluster (started by the first notebook) is stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="nbt-user-"))  # short: Ray's socket paths live under it
    try:
        yield home
    finally:
        stop_cluster(home)


def test_the_users_cluster_has_this_machines_cpus(users_home: Path):
    """What the notebooks run on: the embedded cluster, started with no size given (as the README's first
    command and a first ``%ray_connect`` start it), has this machine's CPUs. Runs first: the notebooks find it."""
    env = users_env(users_home)
    started = start_cluster(users_home)
    assert started.returncode == 0, started.stderr[-3000:]
    status = subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "status"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert status.returncode == 0, status.stderr[-3000:]
    assert f"{len(os.sched_getaffinity(0))} CPU" in status.stdout, status.stdout


# Run All twice in a row (test_a_tutorial_runs_again): their first run is their top-to-bottom run. 06, whose
# second Run All is the shortest of those that launch by name (37 s; 10's took 62 s): a run's name launched
# again is test_run_names.py's, on the session cluster.
RUN_AGAIN = {"06_tune_asha.ipynb": r"sweep (mnist-asha\S*): (\w+),"}
RUN_ONCE = [path for path in NOTEBOOKS if path.name not in RUN_AGAIN]


def _run_top_to_bottom(path: Path, workdir: Path, users_home: Path, capsys: pytest.CaptureFixture[str],
                       turn: str = "") -> Executed:
    """One *Run All* of ``path`` as a user does it; fails the test with the failing cell, or the promise its
    text makes and its outputs do not keep."""
    executed = Executed(path, workdir, users_home)
    with capsys.disabled():
        print(f"\n[notebook] {path.name}{turn}: {executed.seconds:.1f} s")
    if (failure := executed.failure()) is not None:
        pytest.fail(f"{path.name}{turn}: {failure}", pytrace=False)
    if broken := executed.broken_promises():
        pytest.fail(f"{path.name}{turn} ran but does not keep its promises (executed notebook: {executed.output}):"
                    "\n  " + "\n  ".join(broken), pytrace=False)
    ran = committed_form(json.loads(executed.output.read_text(encoding="utf-8")), executed.parameters, executed.paths)
    if differences := drift(json.loads(path.read_text(encoding="utf-8")), ran, path.name):
        pytest.fail(f"{path.name}{turn}: the committed page no longer shows what its code prints (numbers aside); "
                    f"run scripts/refresh-tutorials {path.stem} (executed notebook: {executed.output}):\n  "
                    + "\n  ".join(differences), pytrace=False)
    return executed


@pytest.mark.quick
def test_every_tutorial_runs_top_to_bottom_in_one_test_or_the_other():
    assert set(RUN_AGAIN) <= {path.name for path in NOTEBOOKS}, "RUN_AGAIN names a notebook that is not there"


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", RUN_ONCE, ids=[path.stem for path in RUN_ONCE])
def test_notebook_runs_top_to_bottom(path: Path, users_home: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]):
    _run_top_to_bottom(path, tmp_path, users_home, capsys)


def _numbered(name: str, base: str) -> int:
    """1 for ``base`` itself, N for ``base-N``: which launch of the name a run or sweep was."""
    assert name == base or re.fullmatch(rf"{re.escape(base)}-\d+", name), f"{name!r} is not {base!r} or {base}-N"
    return 1 if name == base else int(name.rsplit("-", 1)[1])


def _on_the_cluster(home: Path) -> dict[str, str]:
    """Every run's and sweep's state on the notebooks' cluster, as ``nbtrain runs --json --live`` says it."""
    done = subprocess.run([sys.executable, "-m", "nbtrain", "runs", "--json", "--live"], env=users_env(home),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    return {**{run["name"]: run["state"] for run in answer["runs"]},
            **{f"sweep {sweep['name']}": sweep["state"] for sweep in answer.get("sweeps", [])}}


@pytest.mark.notebook
@pytest.mark.timeout(1800)
def test_a_tutorial_runs_again(users_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """*Run All* twice in a row on the same cluster, each run top to bottom with its promises kept: the second
    time a notebook launches its names again, and each new sweep is the next ``NAME-N`` while the first
    time's are kept as they ended (06 sweeps as ``mnist-asha``)."""
    for name, pattern in RUN_AGAIN.items():
        seen = []
        for turn in (1, 2):
            workdir = tmp_path / f"{Path(name).stem}-{turn}"
            workdir.mkdir()
            executed = _run_top_to_bottom(NOTEBOOKS_DIR / name, workdir, users_home, capsys, f", run {turn}")
            seen.append(re.findall(pattern, executed.printed())[-1])
        (first, first_other), (second, second_other) = seen
        on_cluster = _on_the_cluster(users_home)
        assert _numbered(second, "mnist-asha") == _numbered(first, "mnist-asha") + 1, seen
        assert first_other == second_other == "succeeded"
        assert on_cluster[f"sweep {first}"] == on_cluster[f"sweep {second}"] == "succeeded", on_cluster


@pytest.mark.quick
def test_the_tutorials_page_states_each_notebooks_promises_as_the_test_checks_them():
    """docs/tutorials.md's table of what each notebook checks is ``PROMISES``, word for word: a promise changed
    in one place (06 once said "above 0.5" on the page while the notebook checked 0.3) fails here."""
    page = (NOTEBOOKS_DIR.parent / "docs" / "tutorials.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        row = f"| [{path.stem}](tutorials/{path.name}) | {'; '.join(words for _, _, words in PROMISES[path.name])} |"
        assert row in page.splitlines(), f"docs/tutorials.md's checks table should have the row\n{row}"


# A home, a temporary folder, or any folder holding nbtrain's own code (an editable install's checkout)
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:root|home|Users|tmp|var/folders)/|[A-Z]:\\\\Users\\\\"
                          r"|(?<![\w.~-])/[\w.-]+(?:/[\w.-]+)*/nbtrain/_")


@pytest.mark.quick
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_no_saved_output_shows_a_path_of_the_machine_that_ran_it(path: Path):
    """A reader's page shows ``~/.nbtrain/…`` where the refresh ran in a temporary home (``machine_paths``)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        outputs = json.dumps(cell.get("outputs", []))
        if found := MACHINE_PATH.search(outputs):
            pytest.fail(f"{path.name}, cell {cell.get('id')} shows {found[0]!r}: "
                        f"…{outputs[max(0, found.start() - 120):][:300]}… (run scripts/refresh-tutorials {path.stem})")


# Ray's own notices and log lines in a cell ("(raylet) A worker died…", "(pid=123) …", Serve's "INFO 2026-… serve"):
# a tutorial page shows what its code prints, and the run's own words for what Ray says in its ids.
RAYS_OWN_LINES = re.compile(r"\(raylet\)|\((?:pid|[A-Za-z]+ pid)=\d+|\b(?:INFO|WARNING|ERROR) \d{4}-\d\d-\d\d ")


@pytest.mark.quick
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_no_saved_output_shows_rays_own_notices(path: Path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))
            if found := RAYS_OWN_LINES.search(text):
                pytest.fail(f"{path.name}, cell {cell.get('id')} shows Ray's own line: "
                            f"{text[found.start():][:200]!r} (keep it out of the cell, then run "
                            f"scripts/refresh-tutorials {path.stem})")

