"""Check, before any worker starts, that the training function can be shipped.

cloudpickle's own error ("cannot pickle '_thread.lock' object") names a type,
not the notebook variable that holds it. We walk what the function reaches —
the globals it names, its closure cells, default arguments, and functions it
calls, recursively — and name the first value that fails, e.g.::

    `lock` (a threading.Lock) cannot be sent to the workers: ...
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from nbtrain._exceptions import NotSerializableError
from nbtrain._packing import shipping
from nbtrain._packing.code_origin import code_names

_SKIP_TYPES = (types.ModuleType, type(None), int, float, str, bytes, bool)


def dumps_checked(fn: Callable[..., Any], what: str = "the training function") -> tuple[bytes, tuple[str, ...]]:
    """Pickle ``fn`` with the notebook's own modules it needs (see :mod:`nbtrain._packing.shipping`); returns the
    bytes a rank loads and the modules sent (``name@hash``). On failure raise :class:`NotSerializableError`
    naming the culprit."""
    try:
        return shipping.dumps_with_modules(fn)
    except NotSerializableError:
        raise
    except Exception as exc:
        culprit = find_unpicklable(fn)
        if culprit is None:
            msg = (f"{what} cannot be sent to the workers: {type(exc).__name__}: {exc}. "
                   "Move the objects it uses into the function body, or create them on the workers.")
            raise NotSerializableError(msg) from exc
        name, value, reason = culprit
        raise NotSerializableError(describe_unpicklable(name, value, reason)) from exc


def describe_unpicklable(name: str, value: Any, reason: str) -> str:
    return (f"`{name}` ({_describe_type(value)}) cannot be sent to the workers: {reason}. "
            f"Create it inside the training code instead of in the notebook, "
            f"or stop referring to `{name}` from the training code.")


def check_values(values: dict[str, Any]) -> None:
    """Check a namespace of named values (what a ``%%ray_train`` cell captured)."""
    for name, value in values.items():
        reason = _pickle_error(value)
        if reason is None:
            continue
        if callable(value) and not isinstance(value, type):
            culprit = find_unpicklable(value)
            if culprit is not None:
                inner, inner_value, inner_reason = culprit
                raise NotSerializableError(describe_unpicklable(f"{name}` → `{inner}", inner_value, inner_reason))
        raise NotSerializableError(describe_unpicklable(name, value, reason))


def _describe_type(value: Any) -> str:
    cls = type(value)
    module = cls.__module__
    if module == "_thread":
        module = "threading"
    qual = cls.__qualname__
    if module == "threading" and qual == "lock":
        qual = "Lock"
    if module == "threading" and qual == "RLock":
        qual = "RLock"
    prefix = "an" if qual[:1].lower() in "aeiou" else "a"
    return f"{prefix} {module}.{qual}" if module not in ("builtins", "__main__") else f"{prefix} {qual}"


def _pickle_error(value: Any) -> str | None:
    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def _references(fn: Any) -> Iterator[tuple[str, Any]]:
    """Named values a function carries with it when pickled by value."""
    if isinstance(fn, functools.partial):
        yield from ((f"partial arg {i}", v) for i, v in enumerate(fn.args))
        yield from fn.keywords.items()
        yield ("partial func", fn.func)
        return
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    if code is None:
        if callable(fn) and hasattr(fn, "__dict__"):
            yield from vars(fn).items()
        return
    names = set(code_names(code))
    globals_ = getattr(func, "__globals__", {})
    for name in sorted(names):
        if name in globals_:
            yield name, globals_[name]
    if func.__closure__:
        for name, cell in zip(code.co_freevars, func.__closure__):
            try:
                yield name, cell.cell_contents
            except ValueError:
                continue
    for i, default in enumerate(func.__defaults__ or ()):
        yield f"default {i}", default
    yield from (func.__kwdefaults__ or {}).items()


def find_unpicklable(fn: Any, _seen: set[int] | None = None) -> tuple[str, Any, str] | None:
    """Return ``(name, value, reason)`` for the first value ``fn`` reaches that fails to pickle."""
    seen = _seen if _seen is not None else set()
    if id(fn) in seen:
        return None
    seen.add(id(fn))
    for name, value in _references(fn):
        if isinstance(value, _SKIP_TYPES) or id(value) in seen:
            continue
        reason = _pickle_error(value)
        if reason is None:
            continue
        if inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, functools.partial):
            deeper = find_unpicklable(value, seen)
            if deeper is not None:
                return deeper
        return name, value, reason
    return None
