"""What sending the notebook's own modules with a run costs at launch: none, a small module, a 50 MB package.

    python benchmarks/shipping.py            # 3 rounds, ~1 min

On its own loopback cluster (4 CPUs), 1-rank runs with warm workers (as a notebook re-running a cell):
each variant's function uses a module from a folder beside this script's temporary directory, found
by name as a notebook's ``from mymodels import Net`` would be. Per launch: how long ``launch()``
took (pickling and packing the files, sending the spec), and launch → the rank's first row (the
rank unpacks the files, imports the module, runs). Variants interleaved; medians printed.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _own_cluster import own_cluster  # noqa: E402

ROUNDS = 3


def _make_modules(root: Path) -> None:
    (root / "small_models.py").write_text("SCALE = 2\n\ndef value():\n    return SCALE\n")
    package = root / "big_models"
    package.mkdir()
    (package / "__init__.py").write_text("def value():\n    return 3\n")
    (package / "weights.bin").write_bytes(os.urandom(50 * 2**20))  # incompressible, as real weights are


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="nbtrain-shipping-"))
    _make_modules(folder)
    sys.path.insert(0, str(folder))
    import big_models
    import small_models

    def none(config):
        import nbtrain

        nbtrain.report(value=1)

    def small(config):
        import nbtrain

        nbtrain.report(value=small_models.value())

    def big(config):
        import nbtrain

        nbtrain.report(value=big_models.value())

    variants = {"no module of its own": none, "a small module (1 file)": small, "a 50 MB package": big}
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with own_cluster("nbtrain-shipping-", num_cpus=4):
        import nbtrain

        nbtrain.launch(none, workers=1, name="shipping-warm-up").wait()
        for round_ in range(ROUNDS):
            for name, fn in variants.items():
                began = time.time()
                run = nbtrain.launch(fn, workers=1, name=f"shipping-{round_}-{len(timings[name])}-{fn.__name__}")
                launched = time.time()
                run.wait()
                first_row = min(row["time"] for row in run.metrics)
                timings[name].append((launched - began, first_row - began))
                print(f"round {round_} {name:26s} launch() {launched - began:5.2f} s, launch → first row "
                      f"{first_row - began:5.2f} s, modules {run.summary().get('modules')}", flush=True)
    print("\n| function uses | launch() (s, median) | launch → first row (s, median) |\n|---|---|---|")
    for name, rows in timings.items():
        print(f"| {name} | {statistics.median(r[0] for r in rows):.2f} | {statistics.median(r[1] for r in rows):.2f} |")


if __name__ == "__main__":
    main()
