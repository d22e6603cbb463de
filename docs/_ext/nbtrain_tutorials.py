"""The tutorials: every notebook in ``notebooks/``, with the outputs it is committed with.

The docs build executes nothing: ``scripts/refresh-tutorials`` runs the notebooks on the embedded
cluster and commits their outputs (each dashboard as its static picture and summary, a note
naming the smaller parameters of that run), so a build from a clean clone, Read the Docs' included,
shows them. Before Sphinx reads its sources this extension copies each notebook to
``docs/tutorials/<name>.ipynb`` (git-ignored), the folder the tutorials page's toctree lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

DOCS = Path(__file__).resolve().parent.parent
NOTEBOOKS = DOCS.parent / "notebooks"
TUTORIALS = DOCS / "tutorials"

logger = logging.getLogger(__name__)


def has_outputs(notebook: dict[str, Any]) -> bool:
    """Whether any code cell of ``notebook`` shows an output."""
    return any(cell.get("outputs") for cell in notebook["cells"] if cell["cell_type"] == "code")


def write_tutorials(app: Sphinx) -> None:
    TUTORIALS.mkdir(exist_ok=True)
    wanted = {path.name for path in NOTEBOOKS.glob("*.ipynb")}
    for stale in TUTORIALS.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    without = []
    for committed in sorted(NOTEBOOKS.glob("*.ipynb")):
        text = committed.read_text(encoding="utf-8")
        if not has_outputs(json.loads(text)):
            without.append(committed.stem)
        target = TUTORIALS / committed.name
        if not target.exists() or target.read_text(encoding="utf-8") != text:  # unchanged: Sphinx keeps its cache
            target.write_text(text, encoding="utf-8")
    logger.info("tutorials without outputs: %d of %d %s", len(without), len(wanted),
                f"({', '.join(without)}: run scripts/refresh-tutorials)" if without else "")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", write_tutorials)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
