"""A Run is made of parts, and views read it only through its public reader (``run.reader``).

The scan below fails when a module under ``nbtrain/_views`` or ``nbtrain/_lab`` reads a private attribute
of a Run (``run._x``, ``self.run._x``, ``trial.run._x``...) or one of the private names a Run or its reader
has or had; the rest checks that each of Run's delegating methods has its part's signature and docstring
(the API reference is built from them), and what the reader does with a window of rows.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from nbtrain._client.run import handle as handle_module
from nbtrain._client.run import reader as reader_module
from nbtrain._client.run.control import RunControl
from nbtrain._client.run.debugging import RunDebugging
from nbtrain._client.run.files import RunFiles
from nbtrain._client.run.handle import Run, last_run_here
from nbtrain._client.run.inspection import RunInspection
from nbtrain._client.run.reader import RunReader

pytestmark = pytest.mark.quick

PACKAGE = Path(__file__).resolve().parent.parent / "nbtrain"
VIEW_PACKAGES = [PACKAGE / "_views", PACKAGE / "_lab"]
# What a Run, its parts and its reader keep privately, and what views once read of a Run.
RUN_PRIVATE = {"_channel", "_reader", "_control", "_files", "_inspection", "_debugging", "_call", "_fresh_summary",
               "_handle", "_address", "_poll", "_steer", "_cursors", "_rows", "_row_base", "_logs", "_log_base",
               "_events", "_has_more", "_views", "_result", "_cached_rows", "_cached_summary", "_cached_events",
               "_cached_log_entries", "_caught_up", "_followers", "_row_window_start", "_log_window_start",
               "_catch_up", "_apply", "_fetch_rows", "_fetch_logs", "_step_of", "_live_ranks", "_failure_to_debug"}
RUN_NAMES = {"run", "runs", "parent", "child", "attached"}


@pytest.fixture(autouse=True)
def _keep_the_last_run_here():
    """The Runs made here are not this kernel's: a nameless ``%ray_stop`` in a later test must not find them."""
    kept = list(handle_module._made_here)
    yield
    handle_module._made_here[:] = kept


def _names_a_run(node: ast.expr) -> bool:
    """``run``, ``self.run``, ``trial.run``, ``self._run``... : an expression that by its name holds a Run."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and name.lstrip("_") in RUN_NAMES


def private_reads_of_a_run(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if _names_a_run(node.value) or (node.attr in RUN_PRIVATE and not on_self):
            found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    return found


def test_the_scan_finds_what_it_is_for():
    source = ("run._cached_summary\nself.run._caught_up\ntrial.run._x\nother._followers\nself._rows\n"
              "run.reader.summary\nself._lock\n")
    assert [text for _line, text in private_reads_of_a_run(source)] == [
        "run._cached_summary", "self.run._caught_up", "trial.run._x", "other._followers"]


def test_no_view_reads_a_private_attribute_of_a_run():
    offences = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
                for package in VIEW_PACKAGES for path in sorted(package.rglob("*.py"))
                for line, text in private_reads_of_a_run(path.read_text())]
    assert not offences, "views read a Run through run.reader, not its private fields:\n" + "\n".join(offences)


def test_a_run_holds_its_parts_instead_of_being_them():
    assert Run.__mro__ == (Run, object)
    run = Run("held", None, "")
    assert isinstance(run.reader, RunReader)
    for part in (run._control, run._files, run._inspection, run._debugging):
        assert part.reader is run.reader
    for module in ("control", "files", "inspection", "debugging"):
        text = (PACKAGE / "_client" / "run" / f"{module}.py").read_text()
        assert "TYPE_CHECKING" not in text and "NotImplementedError" not in text, module


DELEGATED = {RunControl: ["stop", "drain", "adjust", "pause", "resume", "checkpoint_now", "send", "config_at",
                          "changes", "config"],
             RunFiles: ["metrics", "metrics_frame", "logs", "result", "load_checkpoint", "checkpoint_dir"],
             RunInspection: ["stacks", "profile"], RunDebugging: ["debug"]}


@pytest.mark.parametrize("part,name", [(part, name) for part, names in DELEGATED.items() for name in names])
def test_each_delegating_method_says_and_takes_what_its_part_does(part: type, name: str):
    ours, theirs = inspect.getattr_static(Run, name), inspect.getattr_static(part, name)
    assert ours.__doc__ and ours.__doc__ == theirs.__doc__
    if isinstance(ours, property):
        assert isinstance(theirs, property)
        return
    assert inspect.signature(ours) == inspect.signature(theirs)


def test_the_last_run_made_here_is_the_one_a_nameless_magic_takes():
    first, second = Run("first-here", None, ""), Run("second-here", None, "")
    assert last_run_here() is second and first is not second


class FakeSupervisorChannel:
    """Answers polls from an in-memory history, as a supervisor does: rows, logs and events from the cursors."""

    name = "fake"

    def __init__(self, rows: int, page: int) -> None:
        self.rows = [{"rank": 0, "step": step} for step in range(rows)]
        self.page = page

    def poll(self, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]:
        rows = self.rows[cursor:cursor + self.page]
        return {"rows": rows, "logs": [], "events": [], "cursor": cursor + len(rows), "log_cursor": log_cursor,
                "event_cursor": event_cursor, "has_more": cursor + len(rows) < len(self.rows),
                "now": 1.0, "state": "running", "step": len(self.rows) - 1}


def test_the_reader_keeps_a_window_and_reads_the_rest_when_asked(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reader_module, "ROW_WINDOW", 100)
    reader = RunReader(FakeSupervisorChannel(rows=1000, page=40))  # type: ignore[arg-type]
    seen: list[dict[str, Any]] = []
    reader.refresh()
    assert not reader.caught_up and reader.summary["state"] == "running"
    while True:
        seen.extend(reader.rows_since(max(len(seen), reader.row_window_start)))
        if reader.caught_up:
            break
        reader.refresh()
    assert [row["step"] for row in seen] == list(range(1000)), "a view that keeps up misses nothing, twice nothing"
    assert reader.rows_fetched == 1000 and reader.row_window_start > 0 and len(reader.rows_since(0)) <= 150
    assert [row["step"] for row in reader.all_rows()] == list(range(1000))


def test_close_ends_the_views_the_reader_was_given():
    class View:
        closed = False

        def close(self) -> None:
            self.closed = True

    run, views = Run("with-views", None, ""), [View(), View()]
    for view in views:
        run.reader.add_view(view)
    run.close()
    assert all(view.closed for view in views)


def test_the_long_poll_is_declared_once():
    declared = [path for path in PACKAGE.rglob("*.py") if "\nLONG_POLL_S =" in path.read_text()]
    assert [path.name for path in declared] == ["following.py"]
    assert handle_module.POLL_TIMEOUT_S == reader_module.POLL_TIMEOUT_S
