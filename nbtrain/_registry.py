"""The run registry the JupyterLab sidebar lists: one schema for every process that touches it.

Data flows one way. ``launch()`` writes a run's record once, when it starts
the run (``runs/<name>.json``: who, where, when); ``connect()`` writes the
cluster it connected to (``cluster.json``). Nothing that *reads* a run writes
here. ``nbtrain runs`` and the Jupyter server list these records with what the
run's own files say (:mod:`nbtrain._client.run_index`) and, in the server,
what its agent (``nbtrain runs --json --address A``) last said about each
run's cluster, all as :func:`record_from_summary` records, each taken by
:func:`observe` when it is the newest word: a closed notebook's runs stay
listed and live ones stay current.

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
    paused_at: int | None      # the step every rank is held at by run.pause(), while it is
    parent: str | None         # run.fork(): "<parent run> at step <N>"
    rewinds: int | None        # run.rewind()s and guards' rewinds taken so far (from the cluster's answers only)
    patches: int | None        # run.patch()es applied so far (from the cluster's answers only)
    stragglers: list[int]      # ranks its supervisor flags as stragglers now (from the cluster's answers only)
    source: str                # where the record's state and progress come from (SOURCES)


class ClusterRecord(TypedDict, total=False):
    address: str
    kind: str                  # "local" or "remote"
    nodes: int | None
    resources: dict[str, list[float]]   # {"CPU": [used, total], "GPU": [used, total]}
    warm: dict[str, Any]       # warm workers of every notebook session: {"idle", "busy", "next_exit_s"}
    updated: float
    up: bool                   # nbtrain runs without --live: its Ray Client port accepts connections


# What a record's state and progress are from: what its cluster answered now (`nbtrain runs --live`,
# the lab's agent), the run's own files on the head's machine (nbtrain runs), or only the record
# launch() wrote (the state and step then are those at launch).
SOURCES = ("cluster", "files", "launch record")
# What an observation of a run (its cluster's answer, its files) says of it; the rest of a record is
# its identity (name, address, notebook, created), which the registry's record keeps.
OBSERVED_RUN_FIELDS = ("state", "attempt", "progress", "latest", "error", "ended", "updated", "workers", "paused_at",
                       "stragglers", "parent", "rewinds", "patches", "source")
# What a run's files say of it: the rest (its ranks now, a pause, stragglers) only its cluster knows.
FILE_FIELDS = ("state", "attempt", "progress", "latest", "error", "ended", "updated", "source")


def is_whole(value: Any) -> bool:
    """A count: an int of 0 or more (not a bool, not text such as an older nbtrain let through)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _progress(step: Any, total_steps: Any) -> Progress:
    step = step if is_whole(step) else 0
    total = total_steps if is_whole(total_steps) and total_steps > 0 else None
    return {"step": step, "total_steps": total, "fraction": min(1.0, step / total) if total else None}


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


def record_from_summary(summary: dict[str, Any], address: str, source: str = "cluster") -> RunRecord:
    """A supervisor's summary as a registry record (what ``nbtrain runs --json`` prints); ``source``
    says where the summary came from (one of :data:`SOURCES`).

    Never raises for a summary's odd values (a run started by an older nbtrain): a count that is
    not a count reads as unknown, so one such run cannot break the list of every run.
    """
    owner: dict[str, Any] = summary["owner"] if isinstance(summary.get("owner"), dict) else {}
    progress = _progress(summary.get("step"), summary.get("total_steps"))
    state = _text(summary.get("state")) or "unknown"
    if state == RunState.SUCCEEDED:
        progress["fraction"] = 1.0  # done, whether or not it knew its total
    error = summary.get("error")
    return {
        "name": str(summary.get("name")), "state": state, "address": address,
        "created": _time(summary.get("started")), "updated": _time(summary.get("now")) or time.time(),
        "ended": _time(summary.get("ended")), "notebook": _text(owner.get("notebook")),
        "workers": _count(summary.get("world_size")), "attempt": _count(summary.get("attempt")),
        "progress": progress, "latest": _latest(summary.get("latest")),
        "error": (error if isinstance(error, str) else "").split("\n")[0] or None,
        "paused_at": summary["paused_at"] if is_whole(summary.get("paused_at")) else None,
        "parent": _parent(summary.get("parent")),
        "rewinds": _count(summary.get("rewinds")),
        "patches": _count(summary.get("patches")),
        "stragglers": sorted(w["rank"] for w in summary.get("workers") or []
                             if isinstance(w, dict) and w.get("straggler") and w.get("state") == "running"
                             and is_whole(w.get("rank"))),
        "source": source,
    }


def observe(run: dict[str, Any], observed: RunRecord | dict[str, Any],
            fields: tuple[str, ...] = OBSERVED_RUN_FIELDS) -> bool:
    """Take what ``observed`` says of ``run`` (its ``fields``) if it is at least as new as what ``run`` holds;
    returns whether it did. An observation older than the record is one from before a resume rewrote the
    record: the record wins then."""
    if number(observed.get("updated")) < number(run.get("updated")):
        return False
    said: dict[str, Any] = dict(observed)
    run.update((key, said[key]) for key in fields if key in said)
    return True


def _parent(parent: Any) -> str | None:
    if isinstance(parent, dict) and isinstance(parent.get("run"), str) and is_whole(parent.get("step")):
        return f"{parent['run']} at step {parent['step']}"
    return None


def forget_run(name: str, address: str, home: Path | None = None) -> None:
    """Remove the record of run ``name`` on cluster ``address`` (after ``Run.delete()``); another
    cluster's run of the same name keeps its record."""
    record = read_run(name, home)
    if record is not None and record.get("address") == address:
        (runs_dir(home) / f"{name}.json").unlink(missing_ok=True)


def is_terminal(record: RunRecord | dict[str, Any]) -> bool:
    return record.get("state") in TERMINAL_STATE_NAMES


def number(value: Any) -> float:
    """A JSON number as a float; anything else (null, a typo) as 0."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    return value if is_whole(value) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _latest(value: Any) -> dict[str, Any]:
    """Metric values as JSON keeps them: numbers (NaN and infinities too), text, booleans, null."""
    if not isinstance(value, dict):
        return {}
    return {str(key): item for key, item in value.items() if item is None or isinstance(item, (int, float, str))}


def _valid_run(data: Any) -> TypeGuard[RunRecord]:
    return isinstance(data, dict) and isinstance(data.get("name"), str) and bool(data["name"])


def _readable_run(data: Any) -> RunRecord | None:
    """A record file's content with every field of the type the schema says, or ``None`` if it names no run.

    Files outlive versions (and people edit them): a field of the wrong type reads as unknown
    rather than breaking the sidebar's list for every run.
    """
    if not _valid_run(data):
        return None
    raw: dict[str, Any] = dict(data)
    progress: dict[str, Any] = raw["progress"] if isinstance(raw.get("progress"), dict) else {}
    fraction = progress.get("fraction")
    record = cast(RunRecord, raw)
    record.update({
        "state": _text(raw.get("state")) or "unknown", "address": _text(raw.get("address")) or "",
        "created": _time(raw.get("created")), "ended": _time(raw.get("ended")),
        "updated": _time(raw.get("updated")) or 0.0, "notebook": _text(raw.get("notebook")),
        "workers": _count(raw.get("workers")), "attempt": _count(raw.get("attempt")),
        "progress": _progress(progress.get("step"), progress.get("total_steps")),
        "latest": _latest(raw.get("latest")), "error": _text(raw.get("error")),
    })
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 <= fraction <= 1:
        record["progress"]["fraction"] = float(fraction)  # a succeeded run's full bar
    return record


def read_runs(home: Path | None = None) -> list[RunRecord]:
    """Every recorded run, live ones first, then newest first. A broken file is skipped, never raised;
    a record's field of the wrong type reads as unknown (see :func:`_readable_run`)."""
    try:
        paths = sorted(runs_dir(home).glob("*.json"))
    except OSError:
        return []
    records = [record for path in paths if not path.name.startswith(".")
               and (record := _readable_run(read_json(path))) is not None]
    records.sort(key=lambda run: (is_terminal(run), -number(run.get("created"))))
    return records


def read_run(name: str, home: Path | None = None) -> RunRecord | None:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    record = _readable_run(read_json(runs_dir(home) / f"{name}.json"))
    return record if record is not None and record["name"] == name else None


def read_cluster(home: Path | None = None) -> ClusterRecord | None:
    data = read_json(cluster_file(home))
    return cast(ClusterRecord, data) if isinstance(data, dict) and isinstance(data.get("address"), str) else None
