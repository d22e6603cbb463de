"""A rank runs the notebook's code inside its training loop: ``run.exec(source)`` and ``run.patch(source)``.

Both run on the training thread at a step boundary, the same step on every rank (the optimizer's step
post-hook, or a ``report()`` of a loop that gives nbtrain no optimizer), so the model is consistent and every
chosen rank runs the code at once: a collective in ``source`` meets the other ranks'.

The training code's namespace is found on the training thread's stack, outermost first: the frames of the
user's own code (not nbtrain's, torch's, Ray's or Python's), which are the launched function (or the
``%%ray_train`` cell, or the script's module) and whatever of its own it called down to the optimizer's
step. ``exec`` sees their globals and their locals merged (inner frames win), so ``model``, ``optimizer``,
``loss`` and ``step`` are simply there; it can change objects in place, and a name it assigns is its own.
``patch`` runs its definitions in the globals of the outermost frame, the training code's module (or cell,
or script): the next lookup of a patched name there uses the new one. A name the loop bound locally
(``f = augment`` before the loop) keeps the old function: a patch reaches only names looked up as globals.
"""

from __future__ import annotations

import ast
import contextlib
import io
import linecache
import os
import sys
import sysconfig
import traceback
import types
from typing import Any

from nbtrain._cluster.rank.inspection.captured_values import CapturedRepr
from nbtrain._cluster.rank.inspection.thread_stacks import is_library, libraries

MAX_VALUE_BYTES = 16 * 2**20   # a last expression's value larger than this comes back as its repr
MAX_OUTPUT_CHARS = 100_000     # what exec's source printed, per rank (the end kept)


def training_frames() -> list[types.FrameType]:
    """The training code's frames on this (the training) thread, outermost first; empty outside it.

    From the innermost frame outward: library frames until the first of the user's code, then the user's frames
    (torch's between them skipped: a module's ``__call__`` under the user's loop) until the first frame of other
    code that called the training code: nbtrain's worker, a ``%%ray_train`` cell's runner, runpy for a script.
    Code installed in site-packages is a library's (a training loop in an installed package has no namespace
    here); a project installed in editable mode, and the notebook's own modules, are the user's.
    """
    known = libraries()
    torch_dir = known[2]
    installed = tuple({sysconfig.get_paths()["purelib"] + os.sep, sysconfig.get_paths()["platlib"] + os.sep})
    found: list[types.FrameType] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library(filename, known) and not filename.startswith(installed):
            found.append(frame)
        elif found and not filename.startswith(torch_dir):
            break
        frame = frame.f_back
    found.reverse()
    return found


def source_name(kind: str, command_id: int) -> str:
    """The file name a command's source is compiled under (its traceback lines come from it)."""
    return f"<run.{kind} {command_id}>"


def run_source(source: str, command_id: int) -> dict[str, Any]:
    """Run ``source`` in the training code's namespace: ``{"value": the last expression's value (None without
    one), "output": what it printed}``; an exception propagates, its traceback from the source's own lines."""
    frames = training_frames()
    namespace: dict[str, Any] = {}
    for frame in frames:
        namespace.update(frame.f_globals)
    for frame in frames:
        namespace.update(frame.f_locals)
    if not frames:
        namespace["__builtins__"] = __builtins__
    filename = source_name("exec", command_id)
    body, last = _split_last_expression(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        exec(compile(body, filename, "exec"), namespace)
        value = eval(compile(last, filename, "eval"), namespace) if last is not None else None
    output = printed.getvalue()
    return {"value": sendable(value), "output": output[-MAX_OUTPUT_CHARS:]}


def _split_last_expression(source: str) -> tuple[ast.Module, ast.Expression | None]:
    """``source`` as IPython runs a cell: its statements, and its last one apart when it is an expression."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
        assert isinstance(last, ast.Expr)
        return tree, ast.Expression(body=last.value)
    return tree, None


def sendable(value: Any) -> Any:
    """``value`` as it can travel to the notebook: a tensor on the CPU, detached; anything that does not pickle
    (or pickles larger than :data:`MAX_VALUE_BYTES`) as its repr, saying why."""
    import cloudpickle

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu()
    try:
        size = len(cloudpickle.dumps(value))
    except Exception as problem:  # noqa: BLE001 - any value may refuse to pickle
        return CapturedRepr(_repr(value), type(value).__name__, f"not picklable: {type(problem).__name__}")
    if size > MAX_VALUE_BYTES:
        return CapturedRepr(_repr(value), type(value).__name__, f"{size / 2**20:.1f} MB pickled")
    return value


def _repr(value: Any) -> str:
    try:
        return repr(value)[:2000]
    except Exception as problem:  # noqa: BLE001 - a broken __repr__ is the user's
        return f"<{type(value).__name__}: repr failed with {type(problem).__name__}>"


def failure(rank: int, exc: BaseException, filename: str) -> str:
    """One rank's exception in a command's source: its traceback from the source's own first line."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb if tb is not None else exc.__traceback__))
    return f"Rank {rank}:\n{text.rstrip()}"


def patch_globals(source: str, names: list[str], new: bool, command_id: int) -> str | None:
    """Run a patch's definitions in the training code's globals; None once done, else why it was refused (nothing
    rebound): no training code on the stack, or names it does not have (unless ``new``)."""
    frames = training_frames()
    if not frames:
        return "it is not inside its training code at this step boundary"
    target = frames[0].f_globals
    missing = [name for name in names if name not in target]
    if missing and not new:
        has = sorted(name for name, value in target.items()
                     if not name.startswith("_") and not isinstance(value, types.ModuleType))
        shown = ", ".join(has[:30]) + (f" and {len(has) - 30} more" if len(has) > 30 else "")
        return (f"its training code has no {', '.join(missing)}; it has {shown or 'no names of its own'} "
                "(new=True adds a name).")
    filename = source_name("patch", command_id)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), target)
    return None
