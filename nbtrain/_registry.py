"""The on-disk mirror of runs that the JupyterLab sidebar reads.

Every notebook that follows a run writes ``$NBTRAIN_HOME/runs/<name>.json``
(atomically) as it polls; ``nbtrain runs`` (which the lab server's agent
runs) refreshes them from the cluster. A stopped kernel leaves its files, so
runs never vanish from the list.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ._home import nbtrain_home, read_json, write_json_atomic


def runs_dir() -> Path:
    path = nbtrain_home() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_run(summary: dict[str, Any], address: str, latest: dict[str, Any]) -> None:
    total = summary.get("total_steps")
    step = summary.get("step") or 0
    existing = read_json(runs_dir() / f"{summary['name']}.json") or {}
    owner = summary.get("owner") or {}
    write_json_atomic(runs_dir() / f"{summary['name']}.json", {
        "name": summary["name"], "state": summary["state"], "address": address,
        "created": summary.get("started"), "updated": time.time(), "ended": summary.get("ended"),
        "notebook": owner.get("notebook") or existing.get("notebook"),
        "workers": summary.get("world_size"), "attempt": summary.get("attempt"),
        "progress": {"step": step, "total_steps": total,
                     "fraction": min(1.0, step / total) if total else None},
        "latest": latest, "error": (summary.get("error") or "").split("\n")[0] or None,
    })


def read_runs() -> list[dict[str, Any]]:
    return [data for path in sorted(runs_dir().glob("*.json")) if (data := read_json(path))]


def read_run(name: str) -> dict[str, Any] | None:
    return read_json(runs_dir() / f"{name}.json")
