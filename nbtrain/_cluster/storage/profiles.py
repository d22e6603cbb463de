"""Profiles' traces in the run's directory: ``profiles/profile-<command>/rank<rank>.pt.trace.json.gz``.

Written by the supervisor as each profiled rank answers with its trace (see
:mod:`nbtrain._cluster.rank.inspection.profiling`). The layout is what TensorBoard's profiler plugin reads
(``tensorboard --logdir <run dir>/profiles``: a run per profile, a worker per rank); Perfetto
(ui.perfetto.dev) and ``chrome://tracing`` open one file. The last :data:`KEEP_PROFILES` profiles
are kept.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from nbtrain._paths import private_dir, write_atomic

FOLDER = "profiles"
KEEP_PROFILES = 10
_NAME = re.compile(r"^profile-(\d+)$")


def write(run_dir: Path, command_id: int, rank: int, data: bytes) -> str:
    """Keep one rank's gzipped trace (atomically); returns its path. Drops profiles beyond the last few."""
    root = private_dir(Path(run_dir) / FOLDER)
    folder = private_dir(root / f"profile-{int(command_id)}")
    path = folder / f"rank{int(rank)}.pt.trace.json.gz"
    write_atomic(path, data)
    ids = sorted(int(m[1]) for name in os.listdir(root) if (m := _NAME.match(name)))
    for old in ids[:-KEEP_PROFILES]:
        shutil.rmtree(root / f"profile-{old}", ignore_errors=True)
    return str(path)
