"""The ``%%ray_train`` flags, generated from the run options' one declaration (:mod:`nbtrain._options`).

:func:`run_option_flags` adds one ``magic_arguments`` argument per option (so
``--help`` lists them all with their help text and defaults) and
:func:`options_from_args` turns the parsed flags back into a
:class:`~nbtrain._options.RunOptions`, which validates them.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, argument_group

from nbtrain import _options, _sweep_options
from nbtrain._options import RunOptions
from nbtrain._sweep_options import SweepOptions

_PAIR_KINDS = ("literals", "strings", "variables")


def _arguments(field: Any) -> list[argument]:
    meta = _options.info(field)
    help_text = meta.help.replace("%", "%%")  # argparse reads a lone % as a format code ("%ray_debug")
    default = _options.magic_default_of(field)
    shown = f" (default {default})" if default not in (None, False) and meta.kind in ("value", "flag") else ""
    if meta.kind == "flag":
        off = meta.off_flag or "--no-" + meta.flags[0][2:]
        return [argument(*meta.flags, dest=field.name, action="store_true", default=default,
                         help=help_text + shown),
                argument(off, dest=field.name, action="store_false", default=default,
                         help=f"the opposite of {meta.flags[0]}")]
    if meta.kind in (*_PAIR_KINDS, "space"):
        return [argument(*meta.flags, dest=field.name, nargs="+", default=default, metavar=meta.metavar,
                         help=help_text)]
    metavar = meta.metavar or ("N" if meta.parse in (int, float) else None)
    return [argument(*meta.flags, dest=field.name, type=meta.parse, choices=meta.choices, default=default,
                     metavar=metavar, help=help_text + shown)]


def run_option_flags(magic: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a magic with a flag for every run option, in declaration order."""
    return _with_flags(magic, _options.fields())


def sweep_option_flags(magic: Callable[..., Any]) -> Callable[..., Any]:
    """``%%ray_tune``: a flag for every sweep option, then for every run option a trial takes."""
    return _with_flags(magic, [*_sweep_options.fields(), *trial_run_fields()])


def trial_run_fields() -> list[Any]:
    """The run options a sweep passes on to each of its trials (the rest it sets itself)."""
    from nbtrain._client.entry.sweep import SET_BY_THE_SWEEP

    return [field for field in _options.fields() if field.name not in SET_BY_THE_SWEEP]


def _with_flags(magic: Callable[..., Any], fields: list[Any]) -> Callable[..., Any]:
    usual = [field for field in fields if not _options.info(field).tuning]
    tuning = [field for field in fields if _options.info(field).tuning]
    decorators: list[Any] = [deco for field in usual for deco in _arguments(field)]
    if tuning:  # their own --help group, last
        decorators.append(argument_group("tuning options", _options.TUNING_NOTE + "."))
        decorators.extend(deco for field in tuning for deco in _arguments(field))
    for deco in reversed(decorators):  # IPython builds the parser from the last decorator applied first
        magic = deco(magic)
    return magic


def sweep_options_from_args(args: Any, user_ns: dict[str, Any]) -> tuple[SweepOptions, dict[str, Any]]:
    """The parsed ``%%ray_tune`` flags: validated sweep options, and the run options for each trial."""
    sweep = _values(args, user_ns, _sweep_options.fields())
    run = _values(args, user_ns, trial_run_fields())
    defaults = {field.name: field.default for field in trial_run_fields()}
    return SweepOptions(**sweep), {key: value for key, value in run.items() if value != defaults[key]}


def options_from_args(args: Any, user_ns: dict[str, Any]) -> RunOptions:
    """The parsed flags as validated run options (``NbtrainError`` names a bad one)."""
    return RunOptions(**_values(args, user_ns, _options.fields()))


def _values(args: Any, user_ns: dict[str, Any], fields: list[Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in fields:
        value = getattr(args, field.name)
        meta = _options.info(field)
        kind = meta.kind
        flag = meta.flags[0]
        if value is not None and kind == "space":
            value = _sweep_options.parse_space(_pairs(value, flag))
        elif value is not None and kind == "variable":
            value = _variable(user_ns, value, flag)
        elif value is not None and kind == "literals":
            value = parse_config(value, flag)
        elif value is not None and kind == "strings":
            value = {key: raw for key, raw in _pairs(value, flag)}
        elif value is not None and kind == "variables":
            value = {key: _variable(user_ns, raw, flag) for key, raw in _pairs(value, flag)}
        elif value is not None and kind == "json":
            value = _json_or_variable(user_ns, value, flag)
        values[field.name] = value
    return values


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


def _json_or_variable(user_ns: dict[str, Any], text: str, flag: str) -> Any:
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":  # IPython's argument split keeps quotes
        text = text[1:-1]
    if not text.lstrip().startswith("{"):
        return _variable(user_ns, text, flag)
    try:
        return json.loads(text)
    except ValueError as exc:
        msg = (f"{flag} expects a JSON object in quotes, like {flag} '{{\"pip\": [\"timm\"]}}', or the name of a "
               f"notebook dict; {text!r} is not JSON ({exc}).")
        raise UsageError(msg) from None


def _variable(user_ns: dict[str, Any], name: str, flag: str) -> Any:
    if name not in user_ns:
        msg = f"{flag} names the notebook variable {name!r}, which is not defined. Define it in a cell above first."
        raise UsageError(msg)
    return user_ns[name]
