"""The documentation site leaves nothing out, and its code runs.

The quick checks read the site's sources and the references ``docs/_ext/nbtrain_reference.py``
generates from the code: every exported name has an entry in the API reference, every error
class a section in the troubleshooting page, every run option, sweep option, magic, CLI
subcommand and REST route its row. ``test_the_site_builds`` builds the whole site as
``scripts/build-docs`` does (offline, warnings as errors, nitpicky), in a scratch directory.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import nbtrain_reference as reference  # noqa: E402

PUBLIC_MODULES = ("nbtrain", "nbtrain.lightning", "nbtrain.huggingface")


def _documented(api: str, module: str) -> set[str]:
    """The names given an autodoc entry (``.. autofunction:: name``) under ``.. currentmodule:: module``."""
    found: set[str] = set()
    current = None
    for line in api.splitlines():
        if (match := re.match(r"\.\. currentmodule:: (\S+)", line)) is not None:
            current = match.group(1)
        elif (match := re.match(r"\.\. auto(?:function|class|exception):: (\S+)", line)) and current == module:
            found.add(match.group(1))
    return found


@pytest.mark.quick
@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_is_in_the_api_reference(module: str):
    api = (DOCS / "reference" / "api.rst").read_text()
    missing = sorted(set(importlib.import_module(module).__all__) - _documented(api, module))
    assert not missing, f"docs/reference/api.rst has no entry for {module}: {missing}"


@pytest.mark.quick
def test_every_error_class_is_in_the_troubleshooting_page():
    import nbtrain
    from nbtrain import _exceptions

    declared = {cls for cls in vars(_exceptions).values()
                if isinstance(cls, type) and issubclass(cls, nbtrain.NbtrainError)}
    assert set(reference.error_classes()) == declared
    page = "\n".join(reference.errors_rst())
    for cls in declared:
        assert f"\n{cls.__name__}\n" in page, cls
        assert "What to do:" in (cls.__doc__ or ""), f"{cls.__name__}'s docstring should say its causes and the fix"
    assert ".. nbtrain-errors::" in (DOCS / "troubleshooting.rst").read_text()


@pytest.mark.quick
def test_every_option_magic_and_command_is_in_its_reference():
    from nbtrain import _options, _sweep_options

    runs = "\n".join(reference.run_options_rst())
    for field in _options.fields():
        assert f"``{field.name}``" in runs and f"``{_options.info(field).flags[0]}``" in runs, field.name
    sweeps = "\n".join(reference.sweep_options_rst())
    for field in _sweep_options.fields():
        assert f"``{field.name}``" in sweeps, field.name
    magics = "\n".join(reference.magics_rst())
    for spelling in ("%ray_connect", "%%ray_train", "%%ray_tune", "%ray_status", "%ray_attach", "%ray_stop",
                     "%ray_debug"):
        assert f"\n{spelling}\n" in f"\n{magics}", spelling
    commands = "\n".join(reference.cli_rst())
    for name in reference.cli_subcommands():
        assert f"\nnbtrain {name}\n" in f"\n{commands}", name
    assert reference.rest_routes() and reference.rest_rst()  # raises if a route is not in the table
    for page, directive in (("options.rst", "nbtrain-run-options"), ("options.rst", "nbtrain-sweep-options"),
                            ("magics.rst", "nbtrain-magics"), ("cli.rst", "nbtrain-cli"),
                            ("rest.rst", "nbtrain-rest-routes")):
        assert f".. {directive}::" in (DOCS / "reference" / page).read_text(), (page, directive)


@pytest.mark.quick
def test_every_page_and_tutorial_is_in_the_site():
    index = (DOCS / "index.md").read_text()
    pages = {path.stem for path in DOCS.glob("*.md")} | {path.stem for path in DOCS.glob("*.rst")}
    unlisted = sorted(page for page in pages - {"index"} if not re.search(rf"^{page}$", index, re.M))
    assert not unlisted, f"docs/index.md's toctrees leave out {unlisted}"
    assert "tutorials/*" in (DOCS / "tutorials.md").read_text()
    quickstart = (ROOT / "notebooks" / "01_quickstart.ipynb").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb"))[1:]:
        assert notebook.name in quickstart, f"the quickstart's Next section does not list {notebook.name}"


@pytest.mark.quick
def test_tutorials_show_a_tested_run_only_when_its_code_is_the_committed_code(tmp_path: Path):
    import json

    import nbtrain_tutorials as tutorials

    committed = tmp_path / "committed.ipynb"
    cell = {"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None}
    committed.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    widget = {"output_type": "display_data", "data": {tutorials.WIDGET_VIEW: {}, "text/plain": "VBox()"}}
    picture = {"output_type": "display_data", "data": {"text/html": "<svg></svg>"}}
    injected = {**cell, "source": "epochs = 1", "metadata": {"tags": ["injected-parameters"]}}
    executed = tmp_path / "executed.ipynb"
    executed.write_text(json.dumps({"cells": [injected, {**cell, "outputs": [widget, picture]}], "metadata": {},
                                    "nbformat": 4, "nbformat_minor": 5}))
    shown, ran = tutorials.shown(committed, executed)
    assert ran and shown["cells"][1]["outputs"] == [picture]
    cell["source"] = "x = 2"  # the notebook changed since the tests ran it: its old outputs are not shown
    committed.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert tutorials.shown(committed, executed)[1] is False


@pytest.mark.timeout(240)
def test_the_site_builds(tmp_path: Path):
    """The site as CI builds it: offline, every warning an error, every reference to nbtrain's names resolved."""
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                           "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=230, check=False)
    assert done.returncode == 0, done.stderr[-6000:]
    api = (tmp_path / "html" / "reference" / "api.html").read_text()
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            assert f'id="{module}.{name}"' in api, f"{module}.{name} has no entry in the built API reference"


@pytest.mark.quick
def test_every_guide_with_code_says_which_tutorial_or_test_runs_it():
    """The guides' code needs a cluster, so the site does not execute it: each guide with Python code names
    the tutorial (executed by tests/test_notebooks.py) or the test that runs the same calls."""
    untested = [page.name for page in sorted(DOCS.glob("*.md"))
                if "```python" in page.read_text()
                and not re.search(r"notebooks/\d\d_\w+\.ipynb|tests/test_\w+\.py", page.read_text())]
    assert not untested, f"say which tutorial or test runs the code of {untested}"
