"""The tutorials: every notebook in ``notebooks/``, with the outputs of its last tested run.

Notebooks are committed without outputs, and the docs build executes nothing.
``tests/test_notebooks.py`` copies each notebook it executed to ``docs/_executed/``;
before Sphinx reads its sources this extension writes ``docs/tutorials/<name>.ipynb``
from that copy when its code is the committed notebook's code (a stale copy is not
shown), else from the committed notebook, outputs-free. The live dashboard's widgets
are dropped from the outputs (a widget cannot be drawn on a static page): what stays is
what a finished run leaves in a saved notebook, its static picture and summary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

DOCS = Path(__file__).resolve().parent.parent
NOTEBOOKS = DOCS.parent / "notebooks"
EXECUTED = DOCS / "_executed"
TUTORIALS = DOCS / "tutorials"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

logger = logging.getLogger(__name__)


def code_of(notebook: dict[str, Any]) -> list[str]:
    """The notebook's code cells as text, without the cell papermill adds with the run's parameters."""
    return ["".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for cell in notebook["cells"]
            if cell["cell_type"] == "code" and "injected-parameters" not in cell.get("metadata", {}).get("tags", [])]


def shown(committed: Path, executed: Path) -> tuple[dict[str, Any], bool]:
    """The notebook to show for ``committed``, and whether it carries a tested run's outputs."""
    notebook = json.loads(committed.read_text(encoding="utf-8"))
    if executed.exists():
        ran = json.loads(executed.read_text(encoding="utf-8"))
        if code_of(ran) == code_of(notebook):
            return without_widgets(ran), True
    return notebook, False


def without_widgets(notebook: dict[str, Any]) -> dict[str, Any]:
    """``notebook`` without widget views and widget state (a static page cannot draw them)."""
    notebook.get("metadata", {}).get("widgets", {}).pop(WIDGET_STATE, None)
    if not notebook.get("metadata", {}).get("widgets"):
        notebook.get("metadata", {}).pop("widgets", None)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [out for out in cell.get("outputs", []) if WIDGET_VIEW not in out.get("data", {})]
    return notebook


def write_tutorials(app: Sphinx) -> None:
    TUTORIALS.mkdir(exist_ok=True)
    wanted = {path.name for path in NOTEBOOKS.glob("*.ipynb")}
    for stale in TUTORIALS.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    with_outputs = []
    for committed in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook, ran = shown(committed, EXECUTED / committed.name)
        if ran:
            with_outputs.append(committed.stem)
        text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
        target = TUTORIALS / committed.name
        if not target.exists() or target.read_text(encoding="utf-8") != text:  # unchanged: Sphinx keeps its cache
            target.write_text(text, encoding="utf-8")
    logger.info("tutorials with a tested run's outputs: %d of %d (%s)", len(with_outputs), len(wanted),
                ", ".join(with_outputs) or "run the notebook tests to fill docs/_executed/")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", write_tutorials)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
