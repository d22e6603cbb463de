"""Turn on Ray's client-side token support before Ray is imported.

Ray reads ``RAY_AUTH_MODE`` once, when ``ray`` is first imported, and never
again. A notebook usually imports nbtrain before it connects anywhere, so we
set the mode here, pointing ``RAY_AUTH_TOKEN_PATH`` at a file that
:func:`nbtrain.connect` fills with the right token (or leaves empty, in which
case no token is sent and clusters without authentication work as before).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def client_token_file() -> Path:
    home = Path(os.environ.get("NBTRAIN_HOME") or Path.home() / ".nbtrain")
    return home / "cluster" / "client_token"


def prepare() -> None:
    if "ray" in sys.modules or os.environ.get("RAY_AUTH_MODE"):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        path = client_token_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.touch(mode=0o600)
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)


prepare()
