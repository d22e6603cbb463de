"""What one finished view adds to a notebook saved with widget state, as nbclient/papermill save it: a run's
dashboard, a sweep's dashboard, or a comparison of two runs.

Executes a notebook of three cells in a kernel of its own, on an embedded cluster under a throwaway
``NBTRAIN_HOME`` (stopped at the end): ``%load_ext nbtrain`` + ``%ray_connect``, then the cell whose output is
the view, then a cell that prints. nbclient stores the widget state in the notebook's metadata (its default,
as VS Code saves it). Prints the saved size, the widget state's share of it, and the same notebook saved
without that cell's outputs and the widget state:

* ``--view run``: a ``%%ray_train`` cell of ``--steps`` steps on 2 ranks reporting 2 metrics (its dashboard);
* ``--view sweep``: ``nbtrain.tune`` over 4 learning rates, one rank a trial, ``--steps`` reports each, and
  ``sweep.dashboard()`` followed to the sweep's end;
* ``--view compare``: two runs of ``--steps`` steps on 2 ranks, then ``nbtrain.compare([a, b])`` as the
  cell's value (both ended: the frozen picture).

::

    flock /tmp/nbtrain-ray.lock python benchmarks/saved_size.py            # ~1 min on a 2-core VM
    flock /tmp/nbtrain-ray.lock python benchmarks/saved_size.py --view sweep --steps 200
    flock /tmp/nbtrain-ray.lock python benchmarks/saved_size.py --steps 20000 --keep /tmp/saved.ipynb
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

RUN_CELL = """%%ray_train --workers 2 --name saved-size
import math
for step in range({steps}):
    nbtrain.report(loss=1.0 / (step + 1) + 0.01 * math.sin(step), accuracy=step / {steps})
"""

STEPS_FUNCTION = """import math
import nbtrain

def train(config):
    for step in range(config["steps"]):
        nbtrain.report(step=step, loss=config.get("lr", 1.0) / (step + 1) + 0.01 * math.sin(step),
                       accuracy=step / config["steps"])
"""

SWEEP_CELL = STEPS_FUNCTION + """
from ray import tune
sweep = nbtrain.tune(train, space={{"lr": tune.grid_search([0.1, 0.3, 1.0, 3.0])}}, metric="loss", mode="min",
                     workers_per_trial=1, config={{"steps": {steps}}}, name="saved-size-sweep")
view = sweep.dashboard()
sweep.wait()
view.thread.join(timeout=120)
"""

COMPARE_CELL = STEPS_FUNCTION + """
a = nbtrain.launch(train, config={{"steps": {steps}, "lr": 1.0}}, workers=2, name="saved-size-a")
b = nbtrain.launch(train, config={{"steps": {steps}, "lr": 0.5}}, workers=2, name="saved-size-b")
a.wait(); b.wait()
nbtrain.compare([a, b], metric="loss")
"""

VIEWS = {"run": RUN_CELL, "sweep": SWEEP_CELL, "compare": COMPARE_CELL}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--view", choices=sorted(VIEWS), default="run", help="which view to save (run)")
    parser.add_argument("--steps", type=int, default=2000, help="steps of each run or trial (2000)")
    parser.add_argument("--keep", default=None, help="also write the executed notebook here")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="nbtrain-saved-size-")
    env = {**os.environ, "NBTRAIN_HOME": home, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%load_ext nbtrain\n%ray_connect"),
                                         nbformat.v4.new_code_cell(VIEWS[args.view].format(steps=args.steps)),
                                         nbformat.v4.new_code_cell("print('done')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", store_widget_state=True).execute()
    finally:
        subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=env, check=False,
                       capture_output=True)
    text = nbformat.writes(nb)
    if args.keep:
        Path(args.keep).write_text(text)
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    bare = json.loads(text)
    bare["cells"][1]["outputs"] = []
    bare["metadata"].pop("widgets", None)
    bare_size = len(json.dumps(bare, indent=1))
    models = sorted(((len(json.dumps(m)), m.get("model_name")) for m in state.values()), reverse=True)
    print(f"| view | steps | saved notebook | widget state ({len(state)} models) | without the view | "
          f"the view adds | largest models |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.view} | {args.steps:,} | {len(text) / 1024:.0f} KB | {len(json.dumps(state)) / 1024:.0f} KB | "
          f"{bare_size / 1024:.0f} KB | {(len(text) - bare_size) / 1024:.0f} KB | "
          + ", ".join(f"{name} {size / 1024:.0f} KB" for size, name in models[:3]) + " |")


if __name__ == "__main__":
    main()
