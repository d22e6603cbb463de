"""Read the on-disk run registry that notebook kernels write.

The server extension reads the JSON files directly instead of importing the
notebook side's registry module: the server must start (and list runs whose
kernels are long gone) without importing Ray or torch, and the file format is
the contract between the two sides::

    $NBTRAIN_HOME/runs/<name>.json   one run (written atomically by a kernel)
    $NBTRAIN_HOME/cluster.json       the last cluster a notebook connected to

Files that are missing, half-written or not what we expect are skipped, never
raised: one broken file must not hide the other runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

TERMINAL_STATES = frozenset({"succeeded", "failed", "stopped"})


def registry_home() -> Path:
    """``$NBTRAIN_HOME``, else ``~/.nbtrain`` (the same rule as the kernels use)."""
    return Path(os.environ.get("NBTRAIN_HOME") or Path.home() / ".nbtrain")


def is_terminal(run: dict[str, Any]) -> bool:
    return run.get("state") in TERMINAL_STATES


def _read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _valid_run(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("name"), str) and bool(data["name"])


def read_runs(home: Path) -> list[dict[str, Any]]:
    """All runs in the registry, live ones first, then newest first."""
    runs_dir = home / "runs"
    try:
        paths = sorted(runs_dir.glob("*.json"))
    except OSError:
        return []
    runs = []
    for path in paths:
        if path.name.startswith("."):  # a writer's temporary file
            continue
        data = _read_json(path)
        if _valid_run(data):
            runs.append(data)
    runs.sort(key=lambda run: (is_terminal(run), -number(run.get("created"))))
    return runs


def read_run(home: Path, name: str) -> dict[str, Any] | None:
    """One run by name, or None.

    The file is normally ``runs/<name>.json``; if a writer had to spell the
    file name differently, fall back to matching the ``name`` field.
    """
    if name and "/" not in name and "\\" not in name and not name.startswith("."):
        data = _read_json(home / "runs" / f"{name}.json")
        if _valid_run(data) and data["name"] == name:
            return data
    return next((run for run in read_runs(home) if run["name"] == name), None)


def read_cluster(home: Path) -> dict[str, Any] | None:
    data = _read_json(home / "cluster.json")
    if isinstance(data, dict) and isinstance(data.get("address"), str):
        return data
    return None


def mark_stale(run: dict[str, Any], stale_after: float, now: float | None = None) -> dict[str, Any]:
    """Flag a live run whose file has not been updated for ``stale_after`` s.

    Its kernel is probably gone; the sidebar still lists it (runs never
    vanish) but says that the state shown is the last one recorded.
    """
    now = time.time() if now is None else now
    updated = number(run.get("updated") or run.get("created"))
    run["stale"] = (not is_terminal(run)) and stale_after > 0 and now - updated > stale_after
    return run


def number(value: Any) -> float:
    """A JSON number as a float; anything else (null, a typo) as 0."""
    return float(value) if isinstance(value, (int, float)) else 0.0
