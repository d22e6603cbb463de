"""Where a rank is, now: every thread's Python stack, taken from a side thread without pausing the rank.

``run.stacks()`` (and a run that stalls) sends the ranks a ``stacks`` command; the rank's steering
listener answers it the moment it learns it (not at a step: a stuck rank takes none), with
:func:`take_stacks`. ``sys._current_frames()`` needs only the GIL, which a rank blocked in a
collective, in ``time.sleep`` or on a lock has released; a rank stuck in C code that holds it
cannot answer, and the notebook says so.

For the training thread the answer carries a verdict in one line: *waits in a collective
(all_reduce) called from train.py:41*, when the frames below the innermost frame of the user's code
are ``torch.distributed``'s or DDP's (or its backward waits on DDP's gradient all-reduce); else
*elsewhere* and the user's line it is at.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
import traceback
import types
from typing import Any

from nbtrain._cluster.rank.inspection.post_mortem import NBTRAIN_DIR

NBTRAIN_THREADS = ("nbtrain-flush", "nbtrain-steering", "nbtrain-profile")
MAX_FRAMES = 60          # per thread, innermost kept
MAX_LINE = 200

_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_SITE = tuple({sysconfig.get_paths()["purelib"] + os.sep, sysconfig.get_paths()["platlib"] + os.sep})


def _package_dir(name: str) -> str:
    module = sys.modules.get(name)
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep if module and module.__file__ else "\0"


def libraries() -> tuple[str, ...]:
    """Folders whose frames are not the user's code: nbtrain, Ray, torch, Python's standard library."""
    return (NBTRAIN_DIR, _package_dir("ray"), _package_dir("torch"))


def is_library(filename: str, known: tuple[str, ...]) -> bool:
    """Whether a frame of ``filename`` is not the user's code (``known``: :func:`libraries`)."""
    if filename.startswith(known):
        return True
    return (filename.startswith(_STDLIB) and not filename.startswith(_SITE)) or filename.startswith("<frozen")


def _collective_of(callees: list[traceback.FrameSummary], torch_dir: str) -> str | None:
    """The collective the frames below the user's line are in, or None: ``torch.distributed``'s function the
    user's code called (``all_reduce``, ``barrier``...), or ``DDP <function>`` for DistributedDataParallel's own."""
    distributed = torch_dir + "distributed" + os.sep
    ddp = torch_dir + os.path.join("nn", "parallel", "distributed.py")
    for frame in callees:
        if frame.filename.startswith(distributed):
            public = [f.name for f in callees if f.filename.startswith(distributed) and not f.name.startswith("_")
                      and f.name not in ("wrapper", "inner")]
            return public[-1] if public else frame.name
        if frame.filename == ddp:
            return f"DDP {frame.name}"
    return None


def _where(frame: traceback.FrameSummary) -> str:
    line = (frame.line or "").strip()
    return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}" + (f" ({line})" if line else "")


def verdict(frames: list[traceback.FrameSummary], *, paused_at: int | None = None,
            allreduce_in_flight: bool = False) -> tuple[str, str]:
    """(``collective`` | ``elsewhere`` | ``paused`` | ``outside``, the one line that says where) for the
    training thread's frames, outermost first."""
    if paused_at is not None:
        return "paused", f"paused at step {paused_at} by the notebook (run.resume() lets it go on)"
    known = libraries()
    user = [index for index, frame in enumerate(frames) if not is_library(frame.filename, known)]
    if not user:
        return "outside", "is not in the training function (starting, or finishing its attempt)"
    caller = frames[user[-1]]
    callees = frames[user[-1] + 1:]
    collective = _collective_of(callees, known[2])
    if collective is None and allreduce_in_flight and any(f.name == "backward" for f in callees):
        collective = "DDP's gradient all_reduce in backward"
    if collective is not None:
        return "collective", f"waits in a collective ({collective}) called from {_where(caller)}"
    inner = f"; innermost {_where(callees[-1])}" if callees else ""
    return "elsewhere", f"is elsewhere: {_where(caller)}{inner}"


def _snapshot() -> dict[int, list[tuple[Any, int]]]:
    """Each thread's (code, line) pairs, outermost first, as of one moment. The other threads go on running while
    their frames are read, and a frame still running moves to its next line: so the pairs are read in one tight
    loop (no source lines, no file reads) while the interpreter switches threads rarely."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        taken: dict[int, list[tuple[Any, int]]] = {}
        for ident, top in sys._current_frames().items():
            pairs = []
            frame: types.FrameType | None = top
            while frame is not None:
                pairs.append((frame.f_code, frame.f_lineno))
                frame = frame.f_back
            pairs.reverse()
            taken[ident] = pairs
        return taken
    finally:
        sys.setswitchinterval(interval)


def take_stacks(training_thread: int | None, *, paused_at: int | None = None,
                allreduce_in_flight: bool = False) -> dict[str, Any]:
    """Every thread of this process: name, whose it is (``training``, ``user``, ``nbtrain``, ``library``), its frames
    (file, line, function, source; outermost first, the innermost :data:`MAX_FRAMES`: ``cut`` more were left out),
    ``from``: its first frame of the user's code (the ones above are Ray's and nbtrain's), and the training thread's
    verdict (see :func:`verdict`)."""
    names = {thread.ident: thread for thread in threading.enumerate()}
    known = libraries()
    threads: list[dict[str, Any]] = []
    found = ("outside", "has no training thread now (between attempts)")
    for ident, snapshot in _snapshot().items():
        stack = traceback.StackSummary.from_list(
            [(code.co_filename, lineno, code.co_name, linecache.getline(code.co_filename, lineno).strip())
             for code, lineno in snapshot])
        thread = names.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        if ident == training_thread:
            whose = "training"
            found = verdict(list(stack), paused_at=paused_at, allreduce_in_flight=allreduce_in_flight)
        elif name.startswith(NBTRAIN_THREADS):
            whose = "nbtrain"
        elif any(not is_library(f.filename, known) for f in stack):
            whose = "user"
        else:
            whose = "library"  # Ray's, torch's, the standard library's
        cut = max(len(stack) - MAX_FRAMES, 0)
        first_own = next((index for index, f in enumerate(stack) if not is_library(f.filename, known)), 0)
        threads.append({"name": name, "ident": ident, "whose": whose, "cut": cut, "from": max(first_own - cut, 0),
                        "frames": [(f.filename, f.lineno, f.name, (f.line or "")[:MAX_LINE]) for f in stack[cut:]]})
    order = {"training": 0, "user": 1, "nbtrain": 2, "library": 3}
    threads.sort(key=lambda t: (order[t["whose"]], t["name"]))
    return {"kind": found[0], "verdict": found[1], "threads": threads, "pid": os.getpid()}
