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


@pytest.mark.quick
def test_rays_notices_are_not_compared_with_the_page_but_the_codes_lines_after_them_are():
    """A notice of Ray's reaches a cell when it reaches it, with its indented lines; the code's next line counts."""
    def printed(*lines: str) -> dict:
        return {"cells": [{"cell_type": "code", "id": "c", "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "".join(line + "\n" for line in lines)}]}]}

    page = printed("step 3 of 10", "done")
    busy = printed("step 3 of 10",
                   "(raylet) The node with node id: 1f2e and address: 127.0.0.1 has been marked dead because the "
                   "detector has missed too many heartbeats from it. This can happen when a \t(1) raylet crashes",
                   "\t(2) raylet has lagging heartbeats due to slow network or busy workload.", "done")
    assert drift(page, busy, "x.ipynb") == []
    assert drift(printed("1.5× the median"), printed("12× the median"), "x.ipynb") == [], "a number is a number"
    assert drift(page, printed("step 3 of 10", "(raylet) a notice", "finished"), "x.ipynb") == [
        "cell c: the page shows 'done', which the code no longer prints",
        "cell c: the code prints 'finished', which the page does not show"]


@pytest.mark.notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, users_home: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]):
    """One *Run All* of ``path`` as a user does it; fails with the failing cell, or the promise its text makes
    and its outputs do not keep, or a line the page shows that the code no longer prints."""
    executed = Executed(path, tmp_path, users_home)
    with capsys.disabled():
        print(f"\n[notebook] {path.name}: {executed.seconds:.1f} s")
    if (failure := executed.failure()) is not None:
        pytest.fail(f"{path.name}: {failure}", pytrace=False)
    if broken := executed.broken_promises():
        pytest.fail(f"{path.name} ran but does not keep its promises (executed notebook: {executed.output}):"
                    "\n  " + "\n  ".join(broken), pytrace=False)
    ran = committed_form(json.loads(executed.output.read_text(encoding="utf-8")), executed.parameters, executed.paths)
    if differences := drift(json.loads(path.read_text(encoding="utf-8")), ran, path.name):
        pytest.fail(f"{path.name}: the committed page no longer shows what its code prints (numbers aside); "
                    f"run scripts/refresh-tutorials {path.stem} (executed notebook: {executed.output}):\n  "
                    + "\n  ".join(differences), pytrace=False)


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

