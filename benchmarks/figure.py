"""How long ``run.figure()`` takes for a long run, built from a recorded history (no cluster, no browser).

A :class:`nbtrain.Run` whose supervisor is a stand-in answering ``frame_ipc`` with Arrow pages of a fake
history (2 ranks x 5*10^5 steps = 10^6 rows by default; ``loss`` every step, ``epoch`` beside it,
``epoch_loss`` once an epoch of 1,000 steps, a rewind's branch of 500 steps a rank and a change marked), so what
is timed is what a notebook does: read every row as Arrow pages, build the history model (branches, marks,
counters), draw the figure (per-rank traces and the mean, downsampled). Also the parts alone, and the size of
the figure as a saved notebook holds it. Prints a markdown table (each time: the median of ``--repeats`` calls
and the fastest)::

    python benchmarks/figure.py                      # ~30 s on a 2-core VM
    python benchmarks/figure.py --steps 50000 --repeats 3   # 10^5 rows
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa

import nbtrain
from nbtrain._client.run.reader import SupervisorChannel
from nbtrain._client.run.run_history import RunHistory
from nbtrain._views.figures import display_bundle, history_figure


def fake_history(steps: int, ranks: int) -> tuple[pa.Table, dict[str, Any]]:
    step = np.repeat(np.arange(1, steps + 1, dtype=np.int64), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int64), steps)
    noise = np.sin(step * 12.9898 + rank) * 0.02
    loss = 1.0 / np.sqrt(step) + noise
    epoch = (step - 1) // 1000
    time_ = step * 0.01 + rank * 1e-4
    rewound_at = steps // 2  # a rewind recorded there, to 1,000 steps before: the 500 rows per rank before its
    # ranks' recorded going back (5 s of their clock earlier) are a branch it left
    table = pa.table({"rank": rank, "step": step, "attempt": np.ones_like(step), "time": time_, "loss": loss,
                      "epoch": epoch,
                      "epoch_loss": pa.array(np.where(step % 1000 == 0, loss, np.nan), from_pandas=True)})
    summary = {"name": "figure-benchmark", "state": "succeeded", "changes": [
        {"kind": "adjust", "applied_step": steps // 4, "args": {"lr": 0.01},
         "description": f"lr 0.1 → 0.01 at step {steps // 4}"},
        {"kind": "rewind", "applied_step": rewound_at, "args": {"to_step": rewound_at - 1000, "skip": 0, "attempt": 1},
         "rank_times": {str(r): rewound_at * 0.01 - 5.0 for r in range(ranks)},
         "description": f"rewound to step {rewound_at - 1000} from step {rewound_at}"}]}
    return table, summary


def ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def stand_in(table: pa.Table, summary: dict[str, Any]) -> tuple[Any, Any]:
    """``SupervisorChannel.call`` and ``.poll`` answering from the recorded history, as a supervisor would."""
    def call(channel: Any, method: str, start: int, stop: int, timeout: float = 0.0) -> bytes:
        return ipc(table.slice(start, max(0, min(stop, table.num_rows) - start)))

    def poll(channel: Any, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]:
        return {"rows": [], "cursor": table.num_rows, "has_more": False, "logs": [], "log_cursor": 0, "events": [],
                "event_cursor": 0, "now": time.time(), **summary}

    return call, poll


def timed(repeats: int, work: Any) -> tuple[str, Any]:
    """The median and, in parentheses, the fastest of ``repeats`` calls (on a busy machine the fastest is the
    closer to what the work costs), and the last call's result."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        seconds.append(time.perf_counter() - start)
    return f"{statistics.median(seconds):.2f} s ({min(seconds):.2f})", result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    table, summary = fake_history(args.steps, args.ranks)
    call, poll = stand_in(table, summary)
    with mock.patch.object(SupervisorChannel, "call", call), mock.patch.object(SupervisorChannel, "poll", poll):
        run = nbtrain.Run("figure-benchmark", None, "")
        run.figure()  # plotly's first import and its template, once
        whole, figure = timed(args.repeats, run.figure)
        read, _history = timed(args.repeats, run.reader.history)
    frame = table.to_pandas()
    model, _ = timed(args.repeats, lambda: RunHistory(summary, [], frame, frozenset({"epoch"})))
    fresh = iter([RunHistory(summary, [], frame, frozenset({"epoch"})) for _ in range(args.repeats)])
    drawn, _ = timed(args.repeats, lambda: history_figure(run.name, next(fresh)))  # no mean cached from before
    bundle = display_bundle(figure)
    points = max(len(trace.x) for trace in figure.data)
    print(f"| rows | run.figure() | read (Arrow pages) + model | model alone | figure from the model | traces | "
          f"points per trace, most | saved (JSON + HTML) |\n|---|---|---|---|---|---|---|---|\n"
          f"| {table.num_rows:,} | {whole} | {read} | {model} | {drawn} | {len(figure.data)} | "
          f"{points} | {sum(len(json.dumps(part)) for part in bundle.values()) / 1000:.0f} KB |")


if __name__ == "__main__":
    main()
