"""Where nbtrain keeps its local state: ``$NBTRAIN_HOME``, else ``~/.nbtrain``.

The one place every process (notebook kernel, CLI and agent, Jupyter server,
the embedded cluster's supervisors) finds the home directory and the files in
it, so tests and users with several setups move everything with one variable::

    runs/<name>.json       the run registry (written at launch; see _registry)
    cluster.json           the cluster a notebook last connected to
    cluster/               the embedded local cluster: state, token, start log
    storage/<run>/         a run's history and checkpoints (supervisor side)

Reading functions never create anything; writers create what they write.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nbtrain import _json


def nbtrain_home() -> Path:
    return Path(os.environ.get("NBTRAIN_HOME") or Path.home() / ".nbtrain")


def runs_dir(home: Path | None = None) -> Path:
    return (home or nbtrain_home()) / "runs"


def cluster_file(home: Path | None = None) -> Path:
    return (home or nbtrain_home()) / "cluster.json"


def local_cluster_dir() -> Path:
    return nbtrain_home() / "cluster"


def storage_root() -> Path:
    return nbtrain_home() / "storage"


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers (the lab sidebar, another kernel) never see a half-written file; strict JSON (see _json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(_json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        return _json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
