"""What a notebook executed by nbclient (papermill, CI, VS Code's "save with widget state") keeps of its
dashboards: each shown once, each finished run's summary present and never empty, and the whole
dashboard small.

One notebook, one kernel, 9 short runs of different lengths (0 to 40 steps) against the session's
loopback cluster, in the three ways a user shows a run: a blocking ``%%ray_train`` cell, ``run.dashboard()``
as a cell's last line with ``run.wait()`` in the next cell (tutorial 03), and a finished run's
``run.dashboard()`` as the last line. The summary used to race the run's end (the cell returned when the
state turned terminal, before the view's last picture), leaving an empty output behind in 3 runs of 6;
each way shows three runs here. The kernel is the interpreter running the test: ``scripts/ipykernel-venv``'s
python runs it under the other ipykernel major (6 where 7 is installed).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import ipykernel
import nbformat
from nbclient import NotebookClient

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RUNS = 9
SAVED_LIMIT = 300 * 1024  # what one finished dashboard may add to a notebook saved with widget state


def _cell(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(textwrap.dedent(source).strip("\n"))


def _notebook() -> tuple[nbformat.NotebookNode, dict[str, int]]:
    """The notebook, and the index of the cell whose output is each run's dashboard."""
    cells = [_cell("""
        import ipykernel
        import nbtrain
        %load_ext nbtrain
        %ray_connect
        print("ipykernel", ipykernel.__version__)

        def short(config):
            for step in range(config["steps"]):
                nbtrain.report(loss=1.0 / (step + 1))
    """)]
    shown_in: dict[str, int] = {}
    for i in range(RUNS):
        name, steps = f"saved-{i}", (i * 13) % 41
        if i % 3 == 0:
            shown_in[name] = len(cells)
            cells.append(_cell(f"""
                %%ray_train --workers 1 --name {name}
                for step in range({steps}):
                    nbtrain.report(loss=1.0 / (step + 1))
            """))
        elif i % 3 == 1:
            shown_in[name] = len(cells)
            cells.append(_cell(f"""
                run = nbtrain.launch(short, config={{"steps": {steps}}}, workers=1, name="{name}")
                run.dashboard()
            """))
            cells.append(_cell("run.wait()\nprint(run.state)"))
        else:
            shown_in[name] = len(cells)
            cells.append(_cell(f"""
                run = nbtrain.launch(short, config={{"steps": {steps}}}, workers=1, name="{name}", wait=True)
                run.dashboard()
            """))
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook, shown_in


def test_nine_runs_each_leave_one_dashboard_with_its_summary(cluster, tmp_path: Path) -> None:
    notebook, shown_in = _notebook()
    NotebookClient(notebook, timeout=300, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    (tmp_path / "saved.ipynb").write_text(nbformat.writes(notebook))
    said = "".join(o.get("text", "") for o in notebook.cells[0].outputs)
    # the kernel is this interpreter (nbclient's python3): scripts/ipykernel-venv's python tests the other major
    assert f"ipykernel {ipykernel.__version__}" in said, said
    for name, index in shown_in.items():
        outputs = [o for o in notebook.cells[index].outputs if o.get("output_type") in ("display_data",
                                                                                          "execute_result")]
        assert len(outputs) == 1, f"{name}: shown {len(outputs)} times: {[list(o['data']) for o in outputs]}"
        data = outputs[0]["data"]
        assert WIDGET_VIEW in data, f"{name}: {list(data)}"
        summary = data.get("text/html", "")
        assert f"Run {name}: succeeded" in summary and "nbtrain-summary" in summary, f"{name}: {summary[:300]!r}"

    state = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    # each dashboard is one widget model (anywidget's AnyModel); its `final` trait is the summary line
    finals = [m["state"]["final"] for m in state.values()
              if m["model_name"] == "AnyModel" and "nbtrain-final" in m["state"].get("final", "")]
    for name in shown_in:
        assert sum(f"Run {name}: succeeded" in final for final in finals) == 1, f"{name}: {finals}"
    # no plotly.js in the saved state: every dashboard together stays under one dashboard's old size
    assert len(json.dumps(state)) < RUNS * SAVED_LIMIT
    assert max(len(json.dumps(m)) for m in state.values()) < 100 * 1024
