"""Where nbtrain keeps its local state: ``$NBTRAIN_HOME``, else ``~/.nbtrain``.

One function so tests (and users with several setups) can move everything at
once by setting the environment variable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def nbtrain_home() -> Path:
    home = Path(os.environ.get("NBTRAIN_HOME") or Path.home() / ".nbtrain")
    home.mkdir(parents=True, exist_ok=True)
    return home


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers (the lab sidebar, another kernel) never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
