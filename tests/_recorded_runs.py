"""Recorded runs for the history model's and the figures' unit tests: rows, a rewind's record, and a
:class:`~nbtrain.Run` whose supervisor (or its stored files: the same calls) answers from them."""

from __future__ import annotations

import io
import time
from typing import Any

import pyarrow as pa
import pytest

from nbtrain._client.run.handle import Run
from nbtrain._client.run.reader import SupervisorChannel

GONE_BACK = {0: 47.5, 1: 47.8}  # by each rank's clock: when it went back to step 40 (rows' times are their steps)


def rewound_rows() -> list[dict[str, Any]]:
    """Two ranks: steps 1..47, then both go back to step 40 (skipping 41 and 42) and go on to 60."""
    rows = [{"rank": r, "step": s, "attempt": 1, "time": float(s), "loss": 1.0} for s in range(1, 48) for r in (0, 1)]
    rows += [{"rank": r, "step": s, "attempt": 1, "time": 100.0 + s, "loss": 2.0}
             for s in range(43, 61) for r in (0, 1)]
    return rows


def rewind_change(rank_times: dict[int, float] | None = None, applied: int | None = 47) -> dict[str, Any]:
    """A rewind as the run's summary lists it (JSON: rank times keyed by text)."""
    return {"kind": "rewind", "applied_step": applied, "args": {"to_step": 40, "skip": 2, "attempt": 1},
            "rank_times": {str(rank): when for rank, when in (GONE_BACK if rank_times is None else rank_times).items()},
            "description": "rewound to step 40, 2 batches skipped, from step 47"}


SUMMARY = {"state": "succeeded", "changes": [rewind_change()]}
LEFT = {(r, s) for r in (0, 1) for s in range(41, 48)}  # each rank's rows past 40, reported before it went back


def ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def recorded_run(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]], summary: dict[str, Any],
                 events: tuple[dict[str, Any], ...] = ()) -> Run:
    """A :class:`Run` whose supervisor (or stored files: the same calls) answers from recorded rows."""
    table = pa.Table.from_pylist(rows)

    def call(channel: Any, method: str, *args: Any, timeout: float = 0.0) -> Any:
        assert method == "frame_ipc"
        start, stop = args
        return ipc(table.slice(start, max(0, min(stop, table.num_rows) - start)))

    def poll(channel: Any, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]:
        return {"rows": rows[cursor:], "cursor": len(rows), "has_more": False, "logs": [], "log_cursor": log_cursor,
                "events": list(events)[event_cursor:], "event_cursor": len(events), "now": time.time(), **summary}

    monkeypatch.setattr(SupervisorChannel, "call", call)
    monkeypatch.setattr(SupervisorChannel, "poll", poll)
    return Run("recorded", None, "")
