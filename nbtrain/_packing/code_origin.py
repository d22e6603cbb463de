"""Code shipped by value keeps its origin: a rank's traceback names the user's file or notebook cell,
the line, and the source line.

Functions from a notebook cell, a script's ``__main__`` or a module registered with
``cloudpickle.register_pickle_by_value`` travel by value: their code objects are rebuilt on the rank,
which has neither the notebook's cells nor, on a remote cluster, the files. A pickler is also free to
rename that code (cloudpickle 3.1.3 names all of it ``<dynamic-code>``). So nbtrain pickles code
objects itself, on top of cloudpickle: each as compiled (``marshal``, which keeps the file name; a
notebook cell is named ``Cell In[N]``, as IPython's own tracebacks name it) with the source lines of
its file as they were at launch. Rebuilding the code on the rank puts those lines into
:mod:`linecache`, where Python's traceback formatting reads them.

``marshal``'s format is that of one Python version: the notebook and the cluster run the same one
(``connect()`` checks). Runs in the notebook kernel (:func:`dumps`) and in the rank (:func:`_rebuild_code`).
"""

from __future__ import annotations

import inspect
import io
import linecache
import marshal
import sys
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

MAX_SOURCE_CHARS = 2_000_000  # a larger file travels without its lines: tracebacks then show file and line only


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, with the code it carries by value keeping its file name and source."""
    return dumps_naming_modules(obj)[0]


def dumps_naming_modules(obj: Any) -> tuple[bytes, set[str]]:
    """:func:`dumps`, and the modules the pickle may need on the other side: those of the functions,
    classes and modules it refers to by name, and every name the code it carries by value mentions
    (``import x`` in a function's body names ``x`` there; names that are not modules are harmless)."""
    buffer = io.BytesIO()
    pickler = _OriginKeepingPickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.names


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[bytes, str, list[str]]]:
    original = code.co_filename
    shown = display_name(original)
    renamed = _renamed(code, shown) if shown != original else code
    # the list linecache holds for a file is one object: pickle's memo sends it once for all its functions
    return _rebuild_code, (marshal.dumps(renamed), shown, _source_lines(original, shown))


def _rebuild_code(data: bytes, filename: str, lines: list[str]) -> types.CodeType:
    """On the rank: the code as compiled, and its file's lines where tracebacks look for them."""
    code: types.CodeType = marshal.loads(data)
    if lines:
        # mtime None: linecache.checkcache() keeps the entry (the file may not exist here)
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return code


def display_name(filename: str) -> str:
    """``Cell In[N]`` for a notebook cell's code (as IPython's tracebacks say), else ``filename``."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    compiler = getattr(shell, "compile", None)
    try:
        label = compiler.format_code_name(filename) if compiler is not None else None
    except Exception:  # noqa: BLE001 - an IPython without it: keep the file name
        label = None
    return f"{label[0]} {label[1]}" if label else filename


def cell_name() -> str | None:
    """``Cell In[N]`` for the notebook cell running now (a cell magic's own cell), if any: the nearest
    caller whose code IPython compiled from a cell (its execution count moves at different times in
    different IPython versions)."""
    frame = inspect.currentframe()
    while frame is not None:
        shown = display_name(frame.f_code.co_filename)
        if shown != frame.f_code.co_filename:
            return shown
        frame = frame.f_back
    return None


def _source_lines(filename: str, shown: str) -> list[str]:
    lines = linecache.getlines(filename)
    if not lines and shown != filename:
        lines = linecache.getlines(shown)
    return lines if sum(map(len, lines)) <= MAX_SOURCE_CHARS else []


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


class _OriginKeepingPickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle is untyped
    # read by pickle's C implementation when the pickler is created: a class attribute, not an instance one
    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap({types.CodeType: _reduce_code},
                                                            cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.names: set[str] = set()  # module names the pickle may need (see dumps_naming_modules)

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self.names.add(obj.__name__)
        elif isinstance(obj, (type, types.FunctionType)):
            self.names.add(str(getattr(obj, "__module__", None) or ""))
        elif isinstance(obj, types.CodeType):
            self.names.update(code_names(obj))
        return super().reducer_override(obj)


def code_names(code: types.CodeType) -> list[str]:
    """Every global or attribute name ``code`` and the functions and classes defined in it mention,
    each once, in the order they first appear (the names walk that packing, the launch checks and a
    rank's post-mortem share)."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(code_names(const))
    return list(dict.fromkeys(names))
