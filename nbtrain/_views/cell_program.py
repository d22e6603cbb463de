"""A ``%%ray_train`` cell body turned into a training function.

Only the notebook names the body actually uses are shipped (found from the
compiled code's names, nested functions included), not the whole namespace:
a 10 GB DataFrame sitting in the notebook stays there unless the cell uses it.
On the worker the body runs with ``config``, ``rank``, ``world_size`` and
``nbtrain`` defined; a variable named ``result`` becomes that rank's result. Its ``__name__`` is
``"__main__"``, as in the notebook, so a pasted script's ``if __name__ == "__main__":`` block runs,
with ``sys.argv`` set from the magic's ``--args``.
"""

from __future__ import annotations

import builtins
import linecache
import sys
from typing import Any

from nbtrain._packing.code_origin import code_names

CELL_FILENAME = "<%%ray_train cell>"
INJECTED = ("config", "rank", "world_size", "local_rank", "device", "nbtrain")
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})
_NOT_A_BUILTIN = object()


def imported_modules(source: str) -> list[str]:
    """The modules ``source`` imports by absolute name (``import a.b``, ``from c import d``), in order."""
    import ast

    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def referenced_names(source: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """The notebook values ``source`` refers to (modules included; they pickle by name).

    A notebook name that shadows a builtin (``input = 3``, ``id = ...``) or starts with ``_`` is sent
    like any other: on the ranks the cell sees what it sees in the notebook. Dunder names
    (``__name__``...) and IPython's own names are the namespace's, not the user's.
    """
    code = compile(source, CELL_FILENAME, "exec")
    wanted = set(code_names(code))
    return {name: namespace[name] for name in sorted(wanted)
            if name in namespace and name not in INJECTED and name not in _IPYTHON_NAMES
            and not (name.startswith("__") and name.endswith("__"))
            and namespace[name] is not getattr(builtins, name, _NOT_A_BUILTIN)}


class CellProgram:
    """Callable with ``config``: runs the cell body on a worker.

    ``name`` is how tracebacks call the cell (``Cell In[7]``, as IPython does; ``<%%ray_train cell>``
    outside a notebook) and ``magic_line`` its first line: the body's lines keep the numbers the
    cell shows, and the rank's traceback prints the cell's own lines.
    """

    def __init__(self, source: str, captured: dict[str, Any], name: str | None = None,
                 magic_line: str | None = None, argv: tuple[str, ...] = ()) -> None:
        self.filename = name or CELL_FILENAME
        self.lines = ([magic_line.rstrip("\n") + "\n"] if magic_line is not None else []) + source.splitlines(True)
        self.source = "\n" * (len(self.lines) - len(source.splitlines(True))) + source
        # syntax errors surface in the notebook, not on workers; the code travels compiled, so the modules
        # it imports (the user's own among them: see shipping.import_local_modules) go with it
        self.code = compile(self.source, self.filename, "exec")
        self.captured = captured
        self.argv = argv  # sys.argv[1:] while the body runs (the magic's --args)

    def __call__(self, config: dict[str, Any]) -> Any:
        import nbtrain

        linecache.cache[self.filename] = (sum(map(len, self.lines)), None, self.lines, self.filename)
        ctx = nbtrain.get_context()
        scope: dict[str, Any] = {
            "__name__": "__main__", "__builtins__": builtins, **self.captured,
            "config": config, "rank": ctx.rank, "world_size": ctx.world_size,
            "local_rank": ctx.local_rank, "device": ctx.device, "nbtrain": nbtrain,
        }
        saved_argv, sys.argv = sys.argv, [self.filename, *self.argv]
        try:
            exec(self.code, scope)
        finally:
            sys.argv = saved_argv
        return scope.get("result")
