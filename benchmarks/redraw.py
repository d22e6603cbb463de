"""What the dashboard's drawing history costs as a run grows: memory, ingest and redraw time.

Feeds a :class:`~nbtrain._views.dashboard.dashboard.WidgetDashboard` (over a stand-in run, no
cluster, no browser) rows of 3 metrics in batches the size the feed delivers, then
times its redraw: building the traces from the history, and the whole
``_draw_curves`` (the charts widget's messages included, without a frontend), both with nothing new
and after one more step's rows (what a live run's redraw costs). Sizes:
10^5, 10^6 and 10^7 rows from 1 rank, and 256 ranks x 10^4 steps (drawn as the band
with 3 chosen ranks). Prints a markdown table::

    python benchmarks/redraw.py                 # ~1 min on a 2-core VM
    python benchmarks/redraw.py --sizes 1e5,1e6 --wide-steps 1000   # a quick look
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from nbtrain._views.dashboard.dashboard import WidgetDashboard


class StandInRun:
    """The part of :class:`nbtrain.Run` a dashboard reads; rows are handed to its history directly."""

    name = "redraw-benchmark"

    def __init__(self, ranks: int) -> None:
        self.reader = SimpleNamespace(summary={"state": "running", "world_size": ranks, "workers": []},
                                      row_window_start=0, events=[])


def batches(ranks: int, steps: int, size: int) -> Iterator[list[dict[str, Any]]]:
    """Rows as the feed delivers them: every rank's report of a step, then the next step."""
    rows: list[dict[str, Any]] = []
    for step in range(steps):
        rows.extend({"rank": rank, "step": step, "attempt": 1, "time": 0.0, "loss": 1.0 / (step + 1) + rank,
                     "accuracy": 0.5, "lr": 1e-3} for rank in range(ranks))
        if len(rows) >= size:
            yield rows
            rows = []
    if rows:
        yield rows


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(ranks: int, steps: int, batch: int, chosen: list[int], repeats: int) -> dict[str, Any]:
    gc.collect()
    before = rss_mb()
    dashboard = WidgetDashboard(StandInRun(ranks), ranks=chosen)
    dashboard.wide = ranks > 8
    ingest = 0.0
    began = time.perf_counter()
    for rows in batches(ranks, steps, batch):
        start = time.perf_counter()
        dashboard.history.add(rows)
        ingest += time.perf_counter() - start
    total = time.perf_counter() - began
    gc.collect()
    dashboard._draw_curves()  # creates the figures; later redraws update them in place
    build, redraw, grown = [], [], []
    for step in range(steps, steps + repeats):
        dashboard.history.add([{"rank": rank, "step": step, "attempt": 1, "time": 0.0, "loss": 1.0 / (step + 1),
                                "accuracy": 0.5, "lr": 1e-3} for rank in range(ranks)])
        start = time.perf_counter()
        dashboard._draw_curves()
        grown.append(time.perf_counter() - start)
    for _ in range(repeats):
        start = time.perf_counter()
        drawn = [dashboard.curve_traces(metrics) for metrics in dashboard.history.groups().values()]
        build.append(time.perf_counter() - start)
        start = time.perf_counter()
        dashboard._draw_curves()
        redraw.append(time.perf_counter() - start)
    points = max(len(trace.xs) for traces in drawn for trace in traces)
    return {"ranks": ranks, "rows": ranks * steps, "held": dashboard.history.stored_points(),
            "arrays_mb": dashboard.history.nbytes / 2**20, "rss_mb": rss_mb() - before,
            "ingest_s": ingest, "feed_s": total, "build_ms": 1000 * statistics.median(build),
            "redraw_ms": 1000 * statistics.median(redraw),
            "grown_ms": 1000 * statistics.median(grown), "traces": sum(len(t) for t in drawn),
            "max_points": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1e5,1e6,1e7", help="rows from 1 rank, comma-separated (1e5,1e6,1e7)")
    parser.add_argument("--wide-ranks", type=int, default=256, help="ranks of the wide run (256)")
    parser.add_argument("--wide-steps", type=int, default=10_000, help="steps of the wide run (10000)")
    parser.add_argument("--batch", type=int, default=500, help="rows per batch, as the feed delivers (500)")
    parser.add_argument("--repeats", type=int, default=20, help="redraws timed per size; the median is shown (20)")
    args = parser.parse_args()
    measure(2, 100, args.batch, [], 1)  # imports the widget libraries: not counted in the first size's memory
    cases = [(1, int(float(size)), []) for size in args.sizes.split(",")]
    cases.append((args.wide_ranks, args.wide_steps, [0, 17, args.wide_ranks - 1]))
    results = []
    for ranks, steps, chosen in cases:
        results.append(measure(ranks, steps, args.batch, chosen, args.repeats))
        print(f"done: {ranks} rank(s) x {steps} steps", flush=True)
    print("\n| ranks x steps | rows fed | points held | history arrays | RSS growth | ingest (feed incl. "
          "making rows) | traces, most points in one | build traces | redraw, nothing new | redraw, one step more |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['ranks']} x {r['rows'] // r['ranks']:,} | {r['rows']:,} | {r['held']:,} | "
              f"{r['arrays_mb']:.1f} MB | {r['rss_mb']:.0f} MB | {r['ingest_s']:.1f} s ({r['feed_s']:.1f} s) | "
              f"{r['traces']}, {r['max_points']:,} | {r['build_ms']:.1f} ms | {r['redraw_ms']:.1f} ms | "
              f"{r['grown_ms']:.1f} ms |")


if __name__ == "__main__":
    main()
