"""The token ``%ray_connect`` was given: from ``--token``, ``--token-file`` or ``--ask-token``, one of them at most.

Only ``--token`` leaves the token in the notebook and IPython's history, so using it says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from IPython.core.error import UsageError


def token_from_flags(args: Any) -> str | None:
    """The token ``%ray_connect`` was given, from one of its three flags (or ``None``)."""
    given = [flag for flag, value in (("--token", args.token), ("--token-file", args.token_file),
                                      ("--ask-token", args.ask_token)) if value]
    if len(given) > 1:
        raise UsageError(f"%ray_connect: give the token one way, not {' and '.join(given)}.")
    if args.token:
        print("(--token keeps the token in this notebook and IPython's history; "
              "--token-file PATH, --ask-token or $RAY_AUTH_TOKEN do not.)", flush=True)
        return str(args.token)
    if args.token_file:
        path = Path(args.token_file).expanduser()
        try:
            token = path.read_text().strip()
        except OSError as exc:
            msg = f"%ray_connect --token-file: cannot read {path}: {exc.strerror or exc}."
            raise UsageError(msg) from None
        if not token:
            raise UsageError(f"%ray_connect --token-file: {path} is empty; put the cluster's token in it.")
        return token
    if args.ask_token:
        import getpass

        token = getpass.getpass(f"Token for {args.address or 'the cluster'}: ").strip()
        if not token:
            raise UsageError("%ray_connect --ask-token: no token was typed.")
        return token
    return None
