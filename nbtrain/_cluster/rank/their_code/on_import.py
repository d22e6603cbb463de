"""Patch a module of the code's libraries when the code imports it, never importing it for the code.

A patch of ``torch.utils.tensorboard`` or torch's launcher, put in place at every run's start, would cost
each rank the import (and the packages) even when the code never uses them. :func:`after_import` calls
``patch(module)`` at once when the module was imported before, else as the import of it ends. The one import
hook on a rank: Ray Train's seam (``rank/ray_train/seam_watch``) is put in place through it too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


def after_import(name: str, patch: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Run ``patch(module)`` once ``name`` is imported (now, if it is); returns what stops watching."""
    if name in sys.modules:
        patch(sys.modules[name])
        return lambda: None
    watch = _ImportWatch(name, patch)
    sys.meta_path.insert(0, watch)

    def stop() -> None:
        if watch in sys.meta_path:
            sys.meta_path.remove(watch)
    return stop


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Finds the module as the path finder would, with a loader that patches it once it ran."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._patch = patch

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self._name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfter(spec.loader, self._patch)
        return spec


class _PatchAfter(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # what the import system does next, needed now by a patch that reaches the module through its parent
        parent, _, child = module.__name__.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # resources, source and the like: the real loader's
        return getattr(self._loader, name)
