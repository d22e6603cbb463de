"""Failing ranks' post-mortems in the run's directory: ``post-mortems/a<attempt>-r<rank>.pkl``.

Written by the supervisor as each failing rank hands its capture over (see
:mod:`nbtrain._cluster.rank.inspection.post_mortem`), before the rank's failure is known; read by the
supervisor and, once it has exited, by :class:`~nbtrain._cluster.supervisor.stored_run.StoredRun`, so
``%ray_debug`` works after a kernel restart, from another notebook, and on a finished run. The
captures of the last :data:`KEEP_ATTEMPTS` attempts that have any are kept (a run restarting
often would otherwise keep a few MB per rank per attempt).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nbtrain._paths import private_dir, write_atomic

FOLDER = "post-mortems"
KEEP_ATTEMPTS = 3
_NAME = re.compile(r"^a(\d+)-r(\d+)\.pkl$")


def write(run_dir: Path, attempt: int, rank: int, data: bytes) -> None:
    """Keep one rank's capture (atomically), then drop those of older attempts beyond :data:`KEEP_ATTEMPTS`."""
    folder = private_dir(Path(run_dir) / FOLDER)
    write_atomic(folder / f"a{int(attempt)}-r{int(rank)}.pkl", data)
    attempts = sorted({a for a, _ in kept(run_dir)})
    for old in attempts[:-KEEP_ATTEMPTS]:
        for entry in folder.glob(f"a{old}-r*.pkl"):
            entry.unlink(missing_ok=True)


def read(run_dir: Path, attempt: int, rank: int) -> bytes | None:
    """The capture of ``rank`` in ``attempt``, or ``None`` if none was kept."""
    try:
        return (Path(run_dir) / FOLDER / f"a{int(attempt)}-r{int(rank)}.pkl").read_bytes()
    except FileNotFoundError:
        return None


def kept(run_dir: Path) -> list[tuple[int, int]]:
    """(attempt, rank) of every capture kept, in order."""
    try:
        names = os.listdir(Path(run_dir) / FOLDER)
    except OSError:
        return []
    return sorted((int(m[1]), int(m[2])) for name in names if (m := _NAME.match(name)))
