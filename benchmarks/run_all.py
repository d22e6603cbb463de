"""Run All of the quickstart on a fresh kernel and a cluster that is not running yet: seconds from the first
cell's start to the first point the dashboard got (issue 60's "Run All → first point under 10 s").

Executes ``notebooks/01_quickstart.ipynb`` as it is, with nbclient, in a kernel of its own and a throwaway
``NBTRAIN_HOME`` (its ``%ray_connect`` starts the embedded cluster; stopped at the end), then asks the kernel for
its run's phases. Each repetition runs twice, in turn: as users get it, and with ``NBTRAIN_WARM_START=0``
(``connect()`` warms nothing), so the two are compared on the same machine in one run::

    python benchmarks/run_all.py              # 2 repetitions, ~3 min on a 2-core VM
    python benchmarks/run_all.py --reps 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "notebooks" / "01_quickstart.ipynb"
# appended to the notebook: what the kernel's Run saw (seconds since its launch call), and when that call was
PHASES_CELL = """import json
print("PHASES " + json.dumps({"timeline": run.timeline(),
                              "launch_call": run.reader.summary["launch_phases"]["at"]["launch_call"],
                              "warm_ranks": run.reader.summary["launch_phases"]["warm_ranks"]}))"""


def _when(cell: Any, key: str) -> float:
    return datetime.datetime.fromisoformat(cell.metadata.execution[key].replace("Z", "+00:00")).timestamp()


def run_all(warm: bool) -> dict[str, Any]:
    """Execute the quickstart in a fresh home; seconds from the first cell's start to the first point."""
    home = tempfile.mkdtemp(prefix="nbtrain-run-all-")
    env = {**os.environ, "NBTRAIN_HOME": home, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "NBTRAIN_WARM_START": "1" if warm else "0"}
    env.pop("RAY_ADDRESS", None)
    nb = nbformat.read(QUICKSTART, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PHASES_CELL))
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=True,
                       resources={"metadata": {"path": str(QUICKSTART.parent)}}).execute()
    finally:
        subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=env, check=False,
                       capture_output=True)
        os.environ.clear()
        os.environ.update(saved)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    text = "".join(out.get("text", "") for out in code[-1].outputs if out.get("name") == "stdout")
    phases = json.loads(text.split("PHASES ", 1)[1])
    began = _when(code[0], "iopub.execute_input")
    connect = next(cell for cell in code if "%ray_connect" in cell.source)
    first_row = phases["launch_call"] + phases["timeline"]["first_row"]
    cells = [(cell.source.splitlines()[0][:16], _when(cell, "iopub.execute_input") - began,
              _when(cell, "shell.execute_reply") - _when(cell, "iopub.execute_input")) for cell in code[:-1]]
    return {"warm": warm, "first_point_s": first_row - began, "warm_ranks": phases["warm_ranks"], "cells": cells,
            "connect_cell_s": _when(connect, "shell.execute_reply") - _when(connect, "iopub.execute_input"),
            "launch_to_first_row_s": phases["timeline"]["first_row"], "timeline": phases["timeline"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for warm in ((True, False) if rep % 2 == 0 else (False, True)):
            result = run_all(warm)
            results.append(result)
            print(f"rep {rep} {'warm at connect' if warm else 'NBTRAIN_WARM_START=0'}: Run All → first point "
                  f"{result['first_point_s']:.2f} s (the %ray_connect cell {result['connect_cell_s']:.1f} s, "
                  f"launch → first row {result['launch_to_first_row_s']:.2f} s, {result['warm_ranks']}/2 ranks warm; "
                  "phases, s after the launch call: "
                  + ", ".join(f"{phase} {at:.2f}" for phase, at in result["timeline"].items()) + "); cells, "
                  "s from Run All (start +duration): "
                  + ", ".join(f"{first!r} {at:.2f} +{took:.2f}" for first, at, took in result["cells"]), flush=True)
    print("\n| connect() | Run All → first point (s, median) | %ray_connect cell (s) | launch → first row (s) |")
    print("|---|---|---|---|")
    for warm in (True, False):
        mine = [r for r in results if r["warm"] is warm]
        print(f"| {'warms the first run' if warm else 'NBTRAIN_WARM_START=0'} | "
              f"{statistics.median(r['first_point_s'] for r in mine):.2f} | "
              f"{statistics.median(r['connect_cell_s'] for r in mine):.1f} | "
              f"{statistics.median(r['launch_to_first_row_s'] for r in mine):.2f} |")


if __name__ == "__main__":
    main()
