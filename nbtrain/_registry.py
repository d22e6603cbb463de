"""The run registry the JupyterLab sidebar lists: one schema for every process that touches it.

Data flows one way. ``launch()`` writes a run's record once, when it starts
the run (``runs/<name>.json``: who, where, when); ``connect()`` writes the
cluster it connected to (``cluster.json``). Nothing that *reads* a run writes
here. The Jupyter server lists these records and overlays what its agent
(``nbtrain runs --json``, the same :func:`record_from_summary` records) last
said about each run's cluster, so a closed notebook's runs stay listed and
live ones stay current.

The server imports this module without Ray or torch: it uses only the standard
library and :mod:`nbtrain._states`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict, TypeGuard, cast

from nbtrain._paths import cluster_file, read_json, runs_dir, write_json_atomic
from nbtrain._states import TERMINAL_STATE_NAMES, RunState


class Progress(TypedDict):
    step: int
    total_steps: int | None
    fraction: float | None


class RunRecord(TypedDict, total=False):
    """One run as the sidebar shows it."""

    name: str
    state: str                 # a RunState value, or "unknown"
    address: str               # the cluster's ray:// address
    created: float | None
    updated: float             # when this record was last known true
    ended: float | None
    notebook: str | None
    workers: int | None
    attempt: int | None
    progress: Progress
    latest: dict[str, Any]     # the last value of each metric
    error: str | None          # first line of the run's error


class ClusterRecord(TypedDict, total=False):
    address: str
    kind: str                  # "local" or "remote"
    nodes: int | None
    resources: dict[str, list[float]]   # {"CPU": [used, total], "GPU": [used, total]}
    updated: float


def _progress(step: int, total_steps: int | None) -> Progress:
    return {"step": step, "total_steps": total_steps,
            "fraction": min(1.0, step / total_steps) if total_steps else None}


def record_launch(name: str, address: str, *, notebook: str | None, workers: int,
                  total_steps: int | None) -> None:
    """Written by ``launch()``, once per launch (a resume writes it again)."""
    now = time.time()
    record: RunRecord = {
        "name": name, "state": "pending", "address": address, "created": now, "updated": now, "ended": None,
        "notebook": notebook, "workers": workers, "attempt": None, "progress": _progress(0, total_steps),
        "latest": {}, "error": None,
    }
    write_json_atomic(runs_dir() / f"{name}.json", record)


def record_connection(address: str, kind: str) -> None:
    """Written by ``connect()``: which cluster the sidebar's cluster line describes."""
    record: ClusterRecord = {"address": address, "kind": kind, "updated": time.time()}
    write_json_atomic(cluster_file(), record)


def record_from_summary(summary: dict[str, Any], address: str) -> RunRecord:
    """A supervisor's summary as a registry record (what ``nbtrain runs --json`` prints)."""
    owner = summary.get("owner") or {}
    progress = _progress(summary.get("step") or 0, summary.get("total_steps"))
    if summary["state"] == RunState.SUCCEEDED:
        progress["fraction"] = 1.0  # done, whether or not it knew its total
    return {
        "name": summary["name"], "state": summary["state"], "address": address,
        "created": summary.get("started"), "updated": summary.get("now") or time.time(),
        "ended": summary.get("ended"), "notebook": owner.get("notebook"), "workers": summary.get("world_size"),
        "attempt": summary.get("attempt"), "progress": progress,
        "latest": dict(summary.get("latest") or {}),
        "error": (summary.get("error") or "").split("\n")[0] or None,
    }


def is_terminal(record: RunRecord | dict[str, Any]) -> bool:
    return record.get("state") in TERMINAL_STATE_NAMES


def number(value: Any) -> float:
    """A JSON number as a float; anything else (null, a typo) as 0."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _valid_run(data: Any) -> TypeGuard[RunRecord]:
    return isinstance(data, dict) and isinstance(data.get("name"), str) and bool(data["name"])


def read_runs(home: Path | None = None) -> list[RunRecord]:
    """Every recorded run, live ones first, then newest first. Broken files are skipped, never raised."""
    try:
        paths = sorted(runs_dir(home).glob("*.json"))
    except OSError:
        return []
    records = [data for path in paths if not path.name.startswith(".")
               and _valid_run(data := read_json(path))]
    records.sort(key=lambda run: (is_terminal(run), -number(run.get("created"))))
    return records


def read_run(name: str, home: Path | None = None) -> RunRecord | None:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    data = read_json(runs_dir(home) / f"{name}.json")
    return data if _valid_run(data) and data["name"] == name else None


def read_cluster(home: Path | None = None) -> ClusterRecord | None:
    data = read_json(cluster_file(home))
    return cast(ClusterRecord, data) if isinstance(data, dict) and isinstance(data.get("address"), str) else None
