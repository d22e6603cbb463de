"""``nbtrain agent``: the ``nbtrain`` command kept running for the Jupyter server.

A one-off ``python -m nbtrain stop NAME`` pays for a Python start, the Ray
import and a new Ray Client session each time: about 20 s on an idle 2-core
head, over a minute on a busy one, which is far too slow for a Stop button.
The server extension keeps one agent instead. It reads one command per line,
a JSON list of the same arguments the command line takes (``["stop", "NAME",
"--address", "ray://…"]``), and answers each with one JSON line
``{"ok": bool, "output": str}``. Its Ray Client connection stays open between
commands (``nbtrain.connect`` reuses a live one and reconnects a dropped one),
so once connected a stop takes about a second.

``output`` is what the command printed on stdout when it succeeded, whole
(``runs --json`` prints the JSON object the server keeps), and the end of
what it printed on both streams when it failed (the message to show).
stdout carries only the answers: everything else the commands or Ray print is
captured or sent to stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Callable
from typing import IO

_MESSAGE_CHARS = 4000
_COMMANDS = ("runs", "stop", "pause", "resume")


def serve(requests: IO[str], run_command: Callable[[list[str]], int]) -> int:
    """Answer commands from ``requests`` until it closes, each run by ``run_command`` (the CLI's ``main``,
    handed over by the CLI that starts the agent)."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray C-level prints must not corrupt the answers
    sys.stdout = sys.stderr
    for line in requests:
        if not line.strip():
            continue
        ok, output = _answer(line, run_command)
        answers.write(json.dumps({"ok": ok, "output": output}) + "\n")
        answers.flush()
    return 0


def _answer(line: str, run_command: Callable[[list[str]], int]) -> tuple[bool, str]:
    try:
        argv = json.loads(line)
    except json.JSONDecodeError as exc:
        return False, f"nbtrain agent: a request must be a JSON list of arguments ({exc})."
    if not isinstance(argv, list) or not argv or argv[0] not in _COMMANDS:
        return False, f"nbtrain agent: cannot run {argv!r}; it answers {' and '.join(_COMMANDS)} only."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_command([str(arg) for arg in argv])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # noqa: BLE001 - one failed command must not end the agent
            print(f"nbtrain: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
    if code == 0:
        return True, out.getvalue().strip()
    said = "\n".join(filter(None, (err.getvalue().strip(), out.getvalue().strip())))
    return False, said[-_MESSAGE_CHARS:]
