"""Strict JSON for every file nbtrain writes and every answer it serves.

Python's ``json`` writes NaN and infinities as the bare tokens ``NaN`` and
``Infinity``, which are not JSON: the sidebar's ``JSON.parse`` rejects the
whole answer, so one run whose loss went NaN would empty everyone's run list.
Here a non-finite float is written as the string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"`` and read back as the float it was, so a metric that diverged
stays a NaN on every side. The price: a string value spelled exactly like one
of those three reads back as the float.
"""

from __future__ import annotations

import json
import math
from typing import Any

NON_FINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _encodable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _encodable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encodable(item) for item in value]
    return value


def _decoded(value: Any) -> Any:
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {key: _decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value


def dumps(value: Any, *, indent: int | None = None) -> str:
    """Strict JSON text; objects JSON has no type for are written as their ``str()``."""
    return json.dumps(_encodable(value), indent=indent, default=str, allow_nan=False)


def loads(text: str | bytes) -> Any:
    """The value :func:`dumps` wrote (also reads the bare ``NaN`` tokens of older files)."""
    return _decoded(json.loads(text))
