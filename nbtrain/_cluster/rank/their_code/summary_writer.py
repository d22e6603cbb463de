"""Scalars the code writes with ``torch.utils.tensorboard.SummaryWriter`` become the rank's metric rows.

A script written for torchrun logs its curves to TensorBoard, not to nbtrain: while the session runs,
``add_scalar(tag, value, global_step)`` and ``add_scalars(main_tag, {name: value}, global_step)`` still
write the event files, and also give the run a metric (``tag``; ``main_tag/name``) at that step on this
rank. The scalars of one step make one row, as one ``nbtrain.report`` would: a writer keeps the row it is
filling until a scalar of another step comes, until its ``flush()`` or ``close()``, or until the session
ends. A scalar without ``global_step`` is a row of its own at the rank's step (its optimizer updates). The
rows leave the steps steering counts alone (a script may write on rank 0 only; every rank must apply a
change at the same update), so a change's step is the optimizer update it came before: the rows' step
when ``global_step`` counts updates from 1.

``torch.utils.tensorboard`` costs ~0.2 s to import and needs the ``tensorboard`` package: it is patched
when the code imports it (or at once, if this process imported it before), never imported for it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nbtrain._cluster.rank.their_code.on_import import after_import

WRITER_MODULE = "torch.utils.tensorboard.writer"


def install(session: Any) -> Callable[[], None]:
    """Until the returned undo runs, this rank's SummaryWriters also report to ``session``."""
    rows = _Rows(session)
    stop_watching = after_import(WRITER_MODULE, rows.patch)

    def undo() -> None:
        stop_watching()
        rows.undo()
    return undo


class _Rows:
    """The row each writer is filling, and the patched methods that fill and send them."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._filling: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, Any]]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._originals: dict[str, Any] = {}
        self._writer_class: Any = None

    def patch(self, module: ModuleType) -> None:
        cls = module.SummaryWriter
        self._writer_class = cls
        self._originals = {name: cls.__dict__[name] for name in ("add_scalar", "add_scalars", "flush", "close")}
        add_scalar, add_scalars = self._originals["add_scalar"], self._originals["add_scalars"]
        flush, close = self._originals["flush"], self._originals["close"]
        rows = self

        def patched_add_scalar(writer: Any, tag: str, scalar_value: Any, global_step: Any = None,
                               *args: Any, **kwargs: Any) -> None:
            add_scalar(writer, tag, scalar_value, global_step, *args, **kwargs)
            rows.add(writer, {tag: scalar_value}, global_step)

        def patched_add_scalars(writer: Any, main_tag: str, tag_scalar_dict: dict[str, Any], global_step: Any = None,
                                *args: Any, **kwargs: Any) -> None:
            add_scalars(writer, main_tag, tag_scalar_dict, global_step, *args, **kwargs)
            rows.add(writer, {f"{main_tag}/{name}": value for name, value in tag_scalar_dict.items()}, global_step)

        def patched_flush(writer: Any) -> None:
            rows.send(writer)
            flush(writer)

        def patched_close(writer: Any) -> None:
            rows.send(writer)
            close(writer)

        for name, method in (("add_scalar", patched_add_scalar), ("add_scalars", patched_add_scalars),
                             ("flush", patched_flush), ("close", patched_close)):
            method.__doc__ = self._originals[name].__doc__
            setattr(cls, name, method)

    def add(self, writer: Any, metrics: dict[str, Any], global_step: Any) -> None:
        # a number now (a tensor may change in place before the row is sent); the writer took float(value) too
        values = {name: float(value) for name, value in metrics.items()}
        if global_step is None:
            self._session.write_row(None, values)
            return
        step = int(global_step)
        with self._lock:
            filling = self._filling.get(writer)
            if filling is not None and filling[0] == step:
                filling[1].update(values)
                return
            self._filling[writer] = (step, values)
        if filling is not None:  # a scalar of another step: the row of the last one is complete
            self._session.write_row(*filling)

    def send(self, writer: Any) -> None:
        with self._lock:
            filling = self._filling.pop(writer, None)
        if filling is not None:
            self._session.write_row(*filling)

    def undo(self) -> None:
        """The rows still being filled are sent (the session's last push carries them); the class is as it was."""
        with self._lock:
            left = [filling for _, filling in self._filling.items()]
            self._filling.clear()
        for step, values in sorted(left, key=lambda filling: filling[0]):
            self._session.write_row(step, values)
        if self._writer_class is not None:
            for name, method in self._originals.items():
                setattr(self._writer_class, name, method)
            self._writer_class = None
