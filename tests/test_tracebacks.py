"""A failing rank's traceback names the user's code: the notebook cell or file, the line, the source line.

Four origins of the failing function, each as users run it against the session's loopback
cluster: a ``%%ray_train`` cell and a function defined in a notebook cell (a real kernel running a
notebook), a function in a script run by ``python3``, and a function of a module next to the
script, shipped by value. The script's file and the module's folder are removed after
``launch()`` returns, before the ranks raise: a remote cluster never has them, so the source lines
must travel with the run. Whatever the installed cloudpickle does to code it pickles by value
(3.1.3 names it ``<dynamic-code>``), no traceback may say so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def _cell(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(textwrap.dedent(source).strip("\n"))


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.get("output_type") == "stream")


def test_notebook_functions_and_ray_train_cells_show_their_cell_and_line(cluster, tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook(cells=[
        _cell("""
            import nbtrain
            %load_ext nbtrain
            %ray_connect
        """),
        _cell("""
            def train(config):
                total = 0
                for step in range(3):
                    total += step
                raise ValueError(f"boom from a notebook function after {total}")
        """),
        _cell("""
            run = nbtrain.launch(train, workers=1, name="tb-notebook-function")
            run.wait(timeout=120, raise_on_failure=False)
            print(run.error)
        """),
        _cell("""
            %%ray_train --workers 1 --name tb-ray-train-cell --bg --out cell_run
            limit = 2
            if rank >= 0:
                raise RuntimeError(f"boom from a ray_train cell over {limit}")
        """),
        _cell("""
            cell_run.wait(timeout=120, raise_on_failure=False)
            print(cell_run.error)
        """),
    ])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    define, launch, magic, wait = notebook.cells[1:]

    function_error = _text(launch)
    assert "<dynamic-code>" not in function_error
    assert f'File "Cell In[{define.execution_count}]", line 5, in train' in function_error, function_error
    assert 'raise ValueError(f"boom from a notebook function after {total}")' in function_error

    cell_error = _text(wait)
    assert "<dynamic-code>" not in cell_error
    # line 1 is the magic's own line, as the cell shows it
    assert f'File "Cell In[{magic.execution_count}]", line 4, in <module>' in cell_error, cell_error
    assert 'raise RuntimeError(f"boom from a ray_train cell over {limit}")' in cell_error


def test_scripts_and_modules_shipped_by_value_show_file_line_and_source(cluster, tmp_path: Path) -> None:
    """The script and its module are gone from disk before the ranks raise (each rank waits for that)."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "shipped_models.py").write_text(textwrap.dedent("""
        import os
        import time


        def train(config):
            while os.path.exists(config["gone"]):
                time.sleep(0.05)
            raise KeyError("boom from a module shipped by value")
    """).lstrip())
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent("""
        import json
        import os
        import shutil
        import sys
        import time

        import cloudpickle

        import nbtrain

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))
        import shipped_models

        cloudpickle.register_pickle_by_value(shipped_models)


        def train(config):
            while os.path.exists(config["gone"]):
                time.sleep(0.05)
            raise ZeroDivisionError("boom from a script")


        nbtrain.connect(progress=lambda message: None)
        here = os.path.dirname(os.path.abspath(__file__))
        runs = [nbtrain.launch(train, config={"gone": __file__}, workers=1, name="tb-script"),
                nbtrain.launch(shipped_models.train, config={"gone": os.path.join(here, "helpers")}, workers=1,
                               name="tb-module")]
        shutil.rmtree(os.path.join(here, "helpers"))
        os.remove(__file__)
        errors = []
        for run in runs:
            run.wait(timeout=120, raise_on_failure=False)
            errors.append(run.error)
        print(json.dumps(errors))
    """).lstrip())
    done = subprocess.run(["python3", str(script)], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env=os.environ.copy(), stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not script.exists() and not helpers.exists()
    script_error, module_error = json.loads(done.stdout.strip().splitlines()[-1])

    assert "<dynamic-code>" not in script_error + module_error
    assert f'File "{script}", line 20, in train' in script_error, script_error
    assert 'raise ZeroDivisionError("boom from a script")' in script_error
    assert re.search(rf'File "{re.escape(str(helpers / "shipped_models.py"))}", line 8, in train', module_error), \
        module_error
    assert 'raise KeyError("boom from a module shipped by value")' in module_error
