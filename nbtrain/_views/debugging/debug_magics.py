"""``%ray_debug``: IPython's debugger on the post-mortem of a rank that raised.

It parses and delegates to :meth:`nbtrain.Run.debug`; a run, rank or failure that is not
there is a ``UsageError`` of one line (what is missing, and what to type instead).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbtrain._client.kernel.shell import without_comment
from nbtrain._exceptions import NbtrainError


@magics_class
class DebugMagics(Magics):
    """``%ray_debug``; registered with the other nbtrain magics by ``%load_ext nbtrain``."""

    @magic_arguments()
    @argument("name", nargs="?", default=None,
              help="the run's name; default: the last run started, forked or attached here")
    @argument("--rank", "-r", type=int, default=None, help="the rank to debug (default: the first that raised)")
    @argument("--commands", "-c", default=None, metavar='"CMD; CMD"',
              help="debugger commands to run, separated by ';', after which the debugger ends "
                   "(for notebooks run unattended), e.g. --commands \"where; p loss\" (default: none, an interactive "
                   "debugger)")
    @line_magic
    def ray_debug(self, line: str) -> None:
        """Open IPython's debugger on the traceback of a rank that raised, with the local variables it held.

        ``up``/``down``/``where``/``list``/``p``/``pp`` work on the rank's frames (values as
        captured: tensors as shape, dtype, device and statistics). Works after a kernel restart
        and for attached or finished runs.

        Example::

            In [6]: %ray_debug cifar --rank 1
            Rank 1 of run 'cifar' (attempt 1): ValueError: loss is nan
            ipdb> p loss
            In [7]: %ray_debug cifar --commands "where; p loss"
        """
        from nbtrain._client.entry.launch import attach

        line = without_comment(line)
        tokens = line.split()
        if "--help" in tokens or "-h" in tokens:
            print(self.ray_debug.__doc__)
            return
        try:
            args = parse_argstring(self.ray_debug, line)
        except UsageError as exc:
            raise UsageError(f"%ray_debug: {exc}. See `%ray_debug --help`.") from None
        try:
            run = attach(_unquoted(args.name)) if args.name else _last_run()
            run.debug(rank=args.rank, commands=_unquoted(args.commands) if args.commands is not None else None)
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None


def _last_run() -> Any:
    """The run this kernel last started, forked or attached (from Python or a magic), as ``%ray_stop`` takes it."""
    from nbtrain._client.run.handle import last_run_here

    run = last_run_here()
    if run is None:
        raise UsageError("Which run? Give its name: %ray_debug NAME [--rank N] (see %ray_status).")
    return run


def _unquoted(text: str) -> str:
    """IPython keeps the quotes around a magic's argument (``--commands "where; p loss"``): drop them."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text
