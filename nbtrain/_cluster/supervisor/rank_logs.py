"""A lost rank's own last log lines, for a process that died before it could tell the run anything.

A rank process lost while starting (dead while importing torch, say) never started its training
session, so the run holds none of its output. Ray keeps it in the worker's log files on the
rank's node (``worker-<id>-<job>-<pid>.out`` and ``.err``); a zero-CPU task in the rank's bundle
reads them there, finding the folder from its own standard error, which is a file beside them.
Best effort within a few seconds: where they cannot be read (no ``/proc``, output not redirected
to files, the node gone), the answer says where to look instead.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

READ_TIMEOUT_S = 10.0
LINES = 20
_PID = re.compile(r"\bpid: (\d+)")
_RAY_MARKERS = (":job_id:", ":actor_name:", ":task_name:")  # Ray's bookkeeping lines in a worker's log


def pid_of(exc: BaseException) -> int | None:
    """The pid of the lost process, as Ray's error names it (``pid: 1234``), if it does."""
    found = _PID.search(str(exc))
    return int(found.group(1)) if found else None


def last_lines(group: Any, bundle: int, pid: int | None) -> str:
    """The last lines the process ``pid`` wrote on the node of ``group``'s ``bundle``; text that says
    where the logs are when they cannot be read."""
    where = "in Ray's worker logs on the rank's node (`session_latest/logs/worker-*` in Ray's temp dir)"
    if pid is None:
        return f"(Ray did not name the lost process; its output is {where})"
    reader = ray.remote(_read_own_node).options(
        num_cpus=0, max_retries=0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle))
    ref = reader.remote(pid, LINES)
    try:
        text: str = ray.get(ref, timeout=READ_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - best effort: the node may be gone or busy
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
        text = ""
    return text or f"(process {pid} left no output that could be read; look {where})"


def _read_own_node(pid: int, lines: int) -> str:
    """On the rank's node: the tails of ``pid``'s worker log files, standard output then error."""
    try:
        logs = Path(os.readlink("/proc/self/fd/2")).parent
    except OSError:
        return ""
    parts = []
    for stream in ("out", "err"):
        files = sorted(logs.glob(f"worker-*-{pid}.{stream}"), key=lambda path: path.stat().st_mtime)
        if not files:
            continue
        text = files[-1].read_text(errors="replace").splitlines()
        kept = [line for line in text if line.strip() and not line.startswith(_RAY_MARKERS)][-lines:]
        if kept:
            parts.append(f"[{'stdout' if stream == 'out' else 'stderr'} of process {pid}]\n" + "\n".join(kept))
    return "\n".join(parts)
