"""IPython's debugger on a failing rank's post-mortem, in the notebook.

The capture (:mod:`nbtrain._cluster.rank.inspection.post_mortem`) holds each frame's file, line, function,
first line, locals and globals, and the files' source lines. The debugger gets *real* frames:
each captured frame becomes a code object compiled from one statement placed at the captured
line, in the captured file's name, renamed to the captured function and starting at its first
line, run by ``exec`` with the captured locals as its locals. Frame *k*'s statement runs frame
*k+1* through the built-in ``exec`` (no frame of ours comes between), and the innermost one
raises the rank's exception. So ``where``, ``up``/``down``, ``list``/``ll`` (the captured source
lines, put into :mod:`linecache` for the session and taken out after), ``p``/``pp`` and any
expression work as in a post-mortem of the rank's own process; values are as they were
captured (tensors as summaries, values past the size cap as their repr).
"""

from __future__ import annotations

import builtins
import importlib
import linecache
import sys
from typing import Any

import cloudpickle

from nbtrain._cluster.rank.inspection.captured_values import CapturedRepr

MAX_LISTED = 10  # values kept as their repr, named in the header
QUITS = ("q", "quit", "exit", "c", "cont", "continue")
_EXEC = "__nbtrain_exec__"
_NEXT = "__nbtrain_next__"
_RAISE = "__nbtrain_exception__"


class CapturedException(Exception):
    """The rank's exception, when its own class cannot be rebuilt in the notebook."""


def post_mortem(capture: dict[str, Any], title: str, commands: list[str] | None = None, stdout: Any = None) -> None:
    """Open IPython's debugger on ``capture``; ``commands`` run first, and then it ends (``quit``) unless one
    of them already ends it. Without ``commands`` the debugger reads from the notebook's input box."""
    from IPython.core.debugger import Pdb

    out = stdout or sys.stdout
    frames = capture["frames"]
    if not frames:
        out.write(f"{title}: the capture has no frame of the user's code to debug.\n")
        return
    files = set(capture["sources"])

    class CapturedPdb(Pdb):  # type: ignore[misc]  # IPython is untyped
        def canonic(self, filename: str) -> str:
            # "Cell In[3]" is the notebook cell's name on the rank, not a path of this machine
            return filename if filename in files else str(super().canonic(filename))

    out.write(_header(capture, title))
    saved = {name: linecache.cache.get(name) for name in files}
    try:
        for name, lines in capture["sources"].items():
            linecache.cache[name] = (sum(map(len, lines)), None, list(lines), name)
        tb = _rebuilt_traceback(capture)
        debugger = CapturedPdb(stdout=out)
        if commands is not None:
            queued = [c for c in commands if c.strip()]
            if not queued or queued[-1].split()[0] not in QUITS:
                queued.append("quit")
            debugger.cmdqueue.extend(queued)
        debugger.reset()
        debugger.interaction(None, tb)
    finally:
        for name, entry in saved.items():
            if entry is None:
                linecache.cache.pop(name, None)
            else:
                linecache.cache[name] = entry


def _header(capture: dict[str, Any], title: str) -> str:
    size = sum(len(v.get("pickle") or b"") for f in capture["frames"] for v in f["locals"].values())
    lines = [f"{title}: {capture['type']}: {capture['message']}",
             f"Values as the rank held them when it raised ({size / 2**20:.2g} MB of "
             f"{capture['cap_bytes'] / 2**20:.3g} MB kept, debug_capture_mb): tensors as shape, dtype, device and "
             f"statistics; values past the cap or not picklable as their repr."]
    lines.extend(f"Not captured: {what}" for what in capture.get("skipped") or [])
    as_repr = [f"{name} in {frame['function']} ({entry['repr'].why})" for frame in reversed(capture["frames"])
               for name, entry in frame["locals"].items() if isinstance(entry["repr"], CapturedRepr)]
    if as_repr:
        lines.append("Kept as their repr only: " + "; ".join(as_repr[:MAX_LISTED])
                     + (f"; and {len(as_repr) - MAX_LISTED} more" if len(as_repr) > MAX_LISTED else ""))
    lines.append("Commands: where, up, down, list, ll, p EXPR, pp EXPR, quit.")
    return "\n".join(lines) + "\n"


def _rebuilt_traceback(capture: dict[str, Any]) -> Any:
    """A real traceback whose frames are the captured ones (see the module docstring)."""
    steps = []
    for index, frame in enumerate(capture["frames"]):
        innermost = index == len(capture["frames"]) - 1
        statement = f"raise {_RAISE}" if innermost else f"{_EXEC}(*{_NEXT})"
        first = min(int(frame["firstlineno"]), int(frame["lineno"]))
        code = compile("\n" * (int(frame["lineno"]) - first) + statement + "\n", frame["filename"], "exec")
        code = code.replace(co_name=frame["function"], co_firstlineno=first)
        if sys.version_info >= (3, 11):
            code = code.replace(co_qualname=frame["function"])
        steps.append((code, _globals(frame), _values(frame["locals"])))
    exception = _exception(capture)
    for index, (_code, namespace, _local) in enumerate(steps):
        namespace[_EXEC] = builtins.exec
        if index + 1 < len(steps):
            namespace[_NEXT] = steps[index + 1]
        else:
            namespace[_RAISE] = exception
    code, namespace, local = steps[0]
    try:
        exec(code, namespace, local)  # runs only the statements compiled above
    except BaseException as raised:  # noqa: BLE001 - whatever the rank raised
        return raised.__traceback__.tb_next if raised.__traceback__ is not None else None
    msg = "the rebuilt frames did not raise"
    raise AssertionError(msg)


def _globals(frame: dict[str, Any]) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__rank__"}
    for name, entry in frame["globals"].items():
        if "module" in entry:
            try:
                namespace[name] = importlib.import_module(entry["module"])
            except Exception:  # noqa: BLE001 - a module the notebook lacks: its name only
                namespace[name] = CapturedRepr(f"<module {entry['module']!r}>", "module",
                                               "not importable in this notebook")
        else:
            namespace[name] = _value(entry)
    return namespace


def _values(entries: dict[str, Any]) -> dict[str, Any]:
    return {name: _value(entry) for name, entry in entries.items()}


def _value(entry: dict[str, Any]) -> Any:
    data = entry.get("pickle")
    if data is not None:
        try:
            return cloudpickle.loads(data)
        except Exception as problem:  # noqa: BLE001 - e.g. a class this notebook cannot import
            return CapturedRepr(entry["repr"], "value", f"could not be rebuilt here: {type(problem).__name__}")
    return entry["repr"]


def _exception(capture: dict[str, Any]) -> BaseException:
    data = capture.get("exception")
    if data is not None:
        try:
            exception = cloudpickle.loads(data)
            if isinstance(exception, BaseException):
                return exception.with_traceback(None)
        except Exception:  # noqa: BLE001 - its class is not importable here: a stand-in with its text
            pass
    return CapturedException(f"{capture['type']}: {capture['message']}")
