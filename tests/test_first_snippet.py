"""The first code a reader meets, the index page's snippet, runs as printed on the loopback cluster.

Its cells are read from ``docs/index.md`` (every ```python block before "Where to ask") and run in an
IPython shell one after the other, as a notebook would: ``%ray_connect`` with no address reaches the
embedded cluster of this home, which is the session's cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

from _helpers import ipython_shell

INDEX = Path(__file__).resolve().parent.parent / "docs" / "index.md"


def snippet_cells() -> list[str]:
    """The index page's first snippet: its Python blocks, in order."""
    first = INDEX.read_text().split("## Where to ask", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", first, re.M | re.S)


def test_the_index_pages_first_snippet_runs_as_printed(cluster):
    cells = snippet_cells()
    assert len(cells) == 4 and cells[2].startswith("%%ray_train"), "the snippet's cells moved: update this test"
    shell = ipython_shell()
    shell.user_ns.pop("run", None)
    for cell in cells:
        result = shell.run_cell(cell)
        assert result.error_before_exec is None and result.error_in_exec is None, (cell, result)

    run = shell.user_ns["run"]
    assert run.state.value == "succeeded"
    rows = run.metrics
    assert {row["rank"] for row in rows} == {0, 1}
    losses = [row["loss"] for row in rows if row["rank"] == 0]
    assert len(losses) == 3 * 32  # 3 epochs of 4096 samples, 2048 per rank in batches of 64
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10, "the loss should fall"
    assert run.load_checkpoint()["epoch"] == 2
    assert result.result is rows[-1] or result.result == rows[-1]  # the last cell shows the last row
