"""The ``%%ray_train`` flags, generated from the run options' one declaration (:mod:`nbtrain._options`).

:func:`run_option_flags` adds one ``magic_arguments`` argument per option (so
``--help`` lists them all with their help text and defaults) and
:func:`options_from_args` turns the parsed flags back into a
:class:`~nbtrain._options.RunOptions`, which validates them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from nbtrain import _options
from nbtrain._options import RunOptions

_PAIR_KINDS = ("literals", "strings", "variables")


def _arguments(field: Any) -> list[argument]:
    meta = _options.info(field)
    default = _options.magic_default_of(field)
    shown = f" (default {default})" if default not in (None, False) and meta.kind in ("value", "flag") else ""
    if meta.kind == "flag":
        off = meta.off_flag or "--no-" + meta.flags[0][2:]
        return [argument(*meta.flags, dest=field.name, action="store_true", default=default,
                         help=meta.help + shown),
                argument(off, dest=field.name, action="store_false", default=default,
                         help=f"the opposite of {meta.flags[0]}")]
    if meta.kind in _PAIR_KINDS:
        return [argument(*meta.flags, dest=field.name, nargs="+", default=default, metavar=meta.metavar,
                         help=meta.help)]
    metavar = meta.metavar or ("N" if meta.parse in (int, float) else None)
    return [argument(*meta.flags, dest=field.name, type=meta.parse, choices=meta.choices, default=default,
                     metavar=metavar, help=meta.help + shown)]


def run_option_flags(magic: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a magic with a flag for every run option, in declaration order."""
    decorators = [deco for field in _options.fields() for deco in _arguments(field)]
    for deco in reversed(decorators):  # IPython builds the parser from the last decorator applied first
        magic = deco(magic)
    return magic


def options_from_args(args: Any, user_ns: dict[str, Any]) -> RunOptions:
    """The parsed flags as validated run options (``NbtrainError`` names a bad one)."""
    values: dict[str, Any] = {}
    for field in _options.fields():
        value = getattr(args, field.name)
        kind = _options.info(field).kind
        flag = _options.flag_of(field.name)
        if value is not None and kind == "literals":
            value = parse_config(value, flag)
        elif value is not None and kind == "strings":
            value = {key: raw for key, raw in _pairs(value, flag)}
        elif value is not None and kind == "variables":
            value = {key: _variable(user_ns, raw, flag) for key, raw in _pairs(value, flag)}
        values[field.name] = value
    return RunOptions(**values)


def parse_config(pairs: list[str], flag: str = "--config") -> dict[str, Any]:
    """``["lr=0.01", "epochs=5", "opt=adam"]`` → ``{"lr": 0.01, "epochs": 5, "opt": "adam"}``."""
    config: dict[str, Any] = {}
    for key, raw in _pairs(pairs, flag):
        try:
            config[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            config[key] = raw
    return config


def _pairs(pairs: list[str], flag: str) -> list[tuple[str, str]]:
    found = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            msg = (f"{flag} expects key=value pairs like `--config lr=0.01 epochs=5`, got {pair!r}. "
                   f"Keys must be Python identifiers.")
            raise UsageError(msg)
        found.append((key, raw))
    return found


def _variable(user_ns: dict[str, Any], name: str, flag: str) -> Any:
    if name not in user_ns:
        msg = f"{flag} names the notebook variable {name!r}, which is not defined. Define it in a cell above first."
        raise UsageError(msg)
    return user_ns[name]
