"""``%%ray_exec`` and ``%%ray_patch``: a cell run on a live run's ranks between two steps, or its definitions
patched into the run's code at one step. They parse and delegate to :meth:`nbtrain.Run.exec` and
:meth:`nbtrain.Run.patch`; what those refuse is a ``UsageError`` of one line."""

from __future__ import annotations

import html
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbtrain._client.kernel.shell import without_comment
from nbtrain._exceptions import NbtrainError

VALUE_CHARS = 200  # a rank's value as the table shows it


class RankValues(dict[int, Any]):
    """``%%ray_exec``'s answer: ``{rank: value}``, shown as a small table of ranks."""

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{rank}</td><td><code>{html.escape(_short(value))}</code></td></tr>"
                       for rank, value in sorted(self.items()))
        return f"<table><thead><tr><th>rank</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("\n".join(f"rank {rank}: {_short(value)}" for rank, value in sorted(self.items())))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def _ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--ranks takes the ranks separated by commas, like --ranks 0,1; got {text!r}.") from None


@magics_class
class LiveCodeMagics(Magics):
    """``%%ray_exec`` and ``%%ray_patch``; registered with the other nbtrain magics by ``%load_ext nbtrain``."""

    @magic_arguments()
    @argument("name", help="the run's name (see %ray_status)")
    @argument("--ranks", "-r", default=None, metavar="0,1", help="the ranks to run it on (default: every rank)")
    @argument("--timeout", "-t", type=float, default=30.0, help="seconds to wait for every rank's answer")
    @cell_magic
    def ray_exec(self, line: str, cell: str) -> RankValues:
        """Run the cell on a live run's ranks at the next step boundary, in their training code's namespace
        (``model``, ``optimizer``, ``loss``, ``step`` are there); the value of its last line per rank, as a
        table, and what each rank printed, labelled.

        Example::

            In [7]: %%ray_exec cifar
               ...: float(model.fc.weight.norm())
        """
        args = _parsed(self.ray_exec, "%%ray_exec", line)
        run = _run(args.name)
        try:
            return RankValues(run.exec(cell, ranks=_ranks(args.ranks), timeout=args.timeout))
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("name", help="the run's name (see %ray_status)")
    @argument("--new", action="store_true", help="also add names its training code does not have")
    @argument("--timeout", "-t", type=float, default=30.0, help="seconds to wait for every rank to rebind them")
    @cell_magic
    def ray_patch(self, line: str, cell: str) -> None:
        """Rebind the cell's definitions in a live run's training code, at one step on every rank.

        Example::

            In [8]: %%ray_patch cifar
               ...: def augment(x):
               ...:     return x.flip(-1)
            patched augment at step 812
        """
        args = _parsed(self.ray_patch, "%%ray_patch", line)
        run = _run(args.name)
        try:
            step = run.patch(cell, new=args.new, timeout=args.timeout)
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        changed = next((c["description"] for c in reversed(run.changes) if c["kind"] == "patch"), None)
        print(changed or f"patched at step {step}")


def _parsed(magic: Any, name: str, line: str) -> Any:
    try:
        return parse_argstring(magic, without_comment(line))
    except UsageError as exc:
        raise UsageError(f"{name}: {exc}. See `{name} --help`.") from None


def _run(name: str) -> Any:
    from nbtrain._client.entry.launch import attach

    try:
        return attach(name.strip("'\""))
    except NbtrainError as exc:
        raise UsageError(str(exc)) from None
