"""What a failing rank's post-mortem holds in place of values it does not send as they are.

A rank that raises keeps its frames' local variables for ``%ray_debug`` (see
:mod:`nbtrain._cluster.rank.inspection.post_mortem`); the notebook rebuilds them (see
:mod:`nbtrain._views.debugging.debugger`). A tensor travels as a :class:`TensorSummary` (shape, dtype,
device and a few statistics: its data may be gigabytes, and on a GPU), a value that cannot be
pickled or does not fit the capture's size cap as a :class:`CapturedRepr` (its ``repr``, cut
short). Both sides import this module, so the stand-ins unpickle wherever nbtrain is installed.
"""

from __future__ import annotations

from typing import Any


class TensorSummary:
    """A tensor as a failing rank saw it: ``shape``, ``dtype``, ``device``, ``requires_grad``, and
    ``min``/``max``/``mean`` where they could be computed; small tensors keep their values' repr.

    ``p loss`` prints it; ``pp batch.shape``, ``batch.ndim``, ``batch.numel()`` and ``batch.size()``
    answer as for the tensor."""

    def __init__(self, shape: tuple[int, ...], dtype: str, device: str, requires_grad: bool,
                 stats: dict[str, float], values: str | None) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.requires_grad = requires_grad
        self.stats = dict(stats)
        self.values = values

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("min", "max", "mean") and name in self.__dict__.get("stats", {}):
            value = self.stats[name]
            return lambda: value
        raise AttributeError(f"{name!r}: the rank sent this tensor as a summary (shape, dtype, device, "
                             f"min/max/mean), not its data")

    def __repr__(self) -> str:
        stats = " ".join(f"{key}={value:.6g}" for key, value in self.stats.items())
        grad = " requires_grad" if self.requires_grad else ""
        head = f"{self.values} " if self.values else ""
        return (f"{head}<tensor shape={tuple(self.shape)} dtype={self.dtype} device={self.device}{grad}"
                f"{' ' + stats if stats else ''}>")


class CapturedRepr:
    """A value kept only as its ``repr`` (cut at the capture's limit), with why it was not sent whole."""

    def __init__(self, text: str, type_name: str, why: str) -> None:
        self.text = text
        self.type_name = type_name
        self.why = why

    def __repr__(self) -> str:
        return self.text

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("text", "type_name", "why"):
            raise AttributeError(name)
        raise AttributeError(f"{name!r}: this {self.type_name} was kept only as its repr ({self.why})")
