"""A progress line in a saved notebook is one output, the last thing said (a tutorial kept eleven of
"Starting a local Ray cluster… N s"); outside a notebook, a line each time."""

from __future__ import annotations

import io

import nbformat
import pytest
from nbclient import NotebookClient

from nbtrain._client.kernel.progress_line import progress_line

from _jupyterlab import REPO

pytestmark = pytest.mark.quick


def test_a_notebook_keeps_one_progress_output_the_last_said(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from nbtrain._client.kernel.progress_line import progress_line\n"
        "say = progress_line()\n"
        "for waited in (0, 2, 4, 6):\n"
        "    say(f'Starting a local Ray cluster… {waited} s')\n"
        "say('Local Ray cluster ready at 127.0.0.1:6379')\n")])
    NotebookClient(notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = notebook.cells[0].outputs
    assert [output["data"]["text/plain"] for output in outputs] == ["Local Ray cluster ready at 127.0.0.1:6379"]


def test_outside_a_notebook_each_message_is_a_line():
    stream = io.StringIO()
    say = progress_line(stream)
    say("Starting a local Ray cluster… 2 s")
    say("Local Ray cluster ready")
    assert stream.getvalue() == "Starting a local Ray cluster… 2 s\nLocal Ray cluster ready\n"
