"""What the sidebar may do with a run record it did not write itself.

Records come from files anyone with the home directory can edit, from older
nbtrain versions, and from clusters other people run. The sidebar turns two of
their strings into code (the "Open dashboard" cell runs ``%ray_connect
ADDRESS`` and ``%ray_attach NAME`` in the user's kernel, where IPython expands
``{...}`` and ``$name`` in magic lines), so a record is shown as it is only when
its name is a run name nbtrain could have made (:data:`nbtrain._options.NAME_PATTERN`),
its address is a plain ``ray://host:port`` and every field has its type.
Anything else is served as an error row that says what is wrong, with no
actions: one bad record never hides the others. Sweeps are checked the same
way (:func:`sweep_problem`): a trial's "Open dashboard" is its run's, so a
trial names a run only by a run name.
"""

from __future__ import annotations

import re
from typing import Any

from nbtrain._options import NAME_PATTERN

# Ray Client's ray:// or a GCS (a driver's), then a DNS name or IPv4 address, or a bracketed IPv6 address;
# a port of up to 5 digits.
SAFE_ADDRESS = re.compile(
    r"^(?:ray://)?(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$")

_TEXT_FIELDS = ("state", "notebook", "error", "parent")
_NUMBER_FIELDS = ("created", "updated", "ended", "workers", "attempt", "paused_at", "rewinds",
                  "patches")
_OBJECT_FIELDS = ("progress", "latest")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def valid_name(name: Any) -> bool:
    return isinstance(name, str) and NAME_PATTERN.match(name) is not None


def valid_address(address: Any) -> bool:
    return isinstance(address, str) and SAFE_ADDRESS.match(address) is not None \
        and 0 < int(address.rsplit(":", 1)[1]) < 65536


def record_problem(run: dict[str, Any]) -> str | None:
    """Why ``run`` cannot be shown as a run (one sentence), or ``None`` when it can."""
    if not valid_name(run.get("name")):
        return (f"its name {str(run.get('name'))[:120]!r} is not a run name (letters, digits, '_', '.', '-'; "
                "at most 100)")
    address = run.get("address")
    if address not in (None, "") and not valid_address(address):
        return f"its cluster address {str(address)[:120]!r} is not of the form ray://host:port or host:port"
    if not isinstance(run.get("state"), str):
        return "its state is not text"
    for key in _TEXT_FIELDS:
        if run.get(key) is not None and not isinstance(run[key], str):
            return f"its {key!r} is not text"
    for key in _NUMBER_FIELDS:
        if run.get(key) is not None and not _is_number(run[key]):
            return f"its {key!r} is not a number"
    for key in _OBJECT_FIELDS:
        if run.get(key) is not None and not isinstance(run[key], dict):
            return f"its {key!r} is not an object"
    stragglers = run.get("stragglers")
    if stragglers is not None and (not isinstance(stragglers, list) or not all(
            isinstance(rank, int) and not isinstance(rank, bool) for rank in stragglers)):
        return "its 'stragglers' is not a list of ranks"
    progress = run.get("progress") or {}
    if any(progress.get(key) is not None and not _is_number(progress[key])
           for key in ("step", "total_steps", "fraction")):
        return "its progress is not made of numbers"
    return None


def attach_cell(run: dict[str, Any], embedded: bool = False) -> str:
    """The cell "Open dashboard" runs for a run without a notebook (``run`` has no problem); ``embedded``: its
    cluster is this home's embedded one, which a plain ``%ray_connect`` finds (its ports change on a restart).

    Not quoted: the magics split their line as IPython's ``arg_split`` does (``posix=False``), which
    keeps quotes as part of the value. A checked name or address is one plain word with none of
    ``$ { } ! ' " \\`` or spaces, so IPython expands nothing in it and it is one argument as it is.
    """
    connect = "%ray_connect\n" if embedded else f"%ray_connect {run['address']}\n" if run.get("address") else ""
    return f"{connect}%ray_attach {run['name']}"


def malformed_row(run: dict[str, Any], problem: str, source: str) -> dict[str, Any]:
    """What is served in place of a record that cannot be shown: an error row with no actions."""
    name = run.get("name")
    shown = name if isinstance(name, str) and name else "(no name)"
    return {
        "name": shown[:200], "state": "unknown", "address": None, "created": None, "updated": None,
        "ended": None, "notebook": None, "workers": None, "attempt": None, "progress": None, "latest": None,
        "paused_at": None, "rewinds": None, "patches": None,
        "error": f"This run cannot be shown: {problem} ({source}).",
        "malformed": True, "attach_cell": None,
    }


_SWEEP_TEXT_FIELDS = ("metric", "mode", "scheduler", "error")
_SWEEP_NUMBER_FIELDS = ("best", "started", "ended")
_TRIAL_TEXT_FIELDS = ("stop_reason", "error", "waiting_for")
_TRIAL_NUMBER_FIELDS = ("iterations", "last", "best")


def sweep_problem(sweep: dict[str, Any]) -> str | None:
    """Why ``sweep`` (as ``nbtrain runs --json`` lists it) cannot be shown (one sentence), or ``None``."""
    if not valid_name(sweep.get("name")):
        return f"its name {str(sweep.get('name'))[:120]!r} is not a sweep name (letters, digits, '_', '.', '-')"
    if not isinstance(sweep.get("state"), str):
        return "its state is not text"
    for key in _SWEEP_TEXT_FIELDS:
        if sweep.get(key) is not None and not isinstance(sweep[key], str):
            return f"its {key!r} is not text"
    for key in _SWEEP_NUMBER_FIELDS:
        if sweep.get(key) is not None and not _is_number(sweep[key]):
            return f"its {key!r} is not a number"
    trials = sweep.get("trials")
    if not isinstance(trials, list) or not all(isinstance(trial, dict) for trial in trials):
        return "its trials are not a list of trials"
    for trial in trials:
        if not isinstance(trial.get("index"), int) or isinstance(trial["index"], bool):
            return "a trial's index is not a whole number"
        if not isinstance(trial.get("state"), str):
            return f"trial {trial['index']}'s state is not text"
        if trial.get("run") is not None and not valid_name(trial["run"]):
            return f"trial {trial['index']}'s run {str(trial['run'])[:120]!r} is not a run name"
        if trial.get("config") is not None and not isinstance(trial["config"], dict):
            return f"trial {trial['index']}'s config is not an object"
        for key in _TRIAL_TEXT_FIELDS:
            if trial.get(key) is not None and not isinstance(trial[key], str):
                return f"trial {trial['index']}'s {key!r} is not text"
        for key in _TRIAL_NUMBER_FIELDS:
            if trial.get(key) is not None and not _is_number(trial[key]):
                return f"trial {trial['index']}'s {key!r} is not a number"
    return None


def malformed_sweep(sweep: dict[str, Any], problem: str, source: str) -> dict[str, Any]:
    """What is served in place of a sweep that cannot be shown: its name and why, no trials."""
    name = sweep.get("name")
    return {
        "name": (name if isinstance(name, str) and name else "(no name)")[:200], "state": "unknown",
        "address": None, "metric": None, "mode": None, "scheduler": None, "best": None, "started": None,
        "ended": None, "error": f"This sweep cannot be shown: {problem} ({source}).", "trials": [],
        "malformed": True,
    }
