"""``run.debug()``: IPython's debugger on the post-mortem of a rank that raised (a part of :class:`~nbtrain.Run`).

Which rank and attempt come from the run's failures (its summary); the post-mortem itself from
the run's storage, through the supervisor or, once it has exited, the run's files
(:mod:`nbtrain._cluster.storage.post_mortems`): the same after a kernel restart, from another
notebook (``attach``), and on a finished run. Asking for what is not there (a run that did not
fail, a rank it does not have or that did not raise, a rank whose process died) is one
:class:`~nbtrain.NbtrainError` naming the run, the rank and what to do; nothing is changed.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from nbtrain._client import views
from nbtrain._client.run.reader import RunReader
from nbtrain._client.run.stored import READ_TIMEOUT_S
from nbtrain._exceptions import NbtrainError


class RunDebugging:
    """``run.debug()`` delegates here."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.name = reader.channel.name
        self._call = reader.channel.call

    def debug(self, rank: int | None = None, *, commands: list[str] | str | None = None,
              stdout: Any = None) -> None:
        """Open IPython's debugger on the traceback of a rank that raised, in this notebook.

        ``rank``: default the first rank that raised in the latest attempt that had one. The
        frames are the rank's own, from its first frame of your code on, with the local
        variables they held (within the run's ``debug_capture_mb``; tensors as shape, dtype,
        device and statistics): ``where``, ``up``, ``down``, ``list``, ``p loss``,
        ``pp batch.shape`` work as in ``%debug``. ``commands`` (a list, or one string with
        ``;`` between commands) are run first and then the debugger ends: for notebooks run
        unattended. Works after a kernel restart and on runs from ``attach()``. Example::

            run.debug()                                   # the failing rank, interactively
            run.debug(rank=1, commands="where; p loss")   # scripted
        """
        commands = _command_list(commands)
        attempt, chosen = self._failure_to_debug(rank)
        data = self._call("post_mortem", attempt, chosen, timeout=READ_TIMEOUT_S)
        if data is None:
            msg = (f"Run {self.name!r}: rank {chosen} raised in attempt {attempt}, but it kept no post-mortem "
                   f"(the run's debug_capture_mb is 0, or the rank could not send it: see run.logs({chosen})); "
                   f"run.error has its traceback.")
            raise NbtrainError(msg)
        views.open_view(views.POST_MORTEM, cloudpickle.loads(data),
                        f"Rank {chosen} of run {self.name!r} (attempt {attempt})", commands, stdout)

    def _failure_to_debug(self, rank: int | None) -> tuple[int, int]:
        """(attempt, rank) of the failure to open, or the one-line error that says why there is none."""
        summary = self.reader.fetch_summary()
        failures = [f for f in summary.get("failures") or [] if isinstance(f, dict)]
        raised = [f for f in failures if f.get("kind") == "raised" and f.get("rank") is not None]
        if rank is not None:
            _check_rank(self.name, rank, summary)
        if not raised:
            if failures:
                what = failures[-1].get("summary") or failures[-1].get("kind")
                msg = (f"Run {self.name!r} has no rank that raised a Python exception to debug (its failure: "
                       f"{what}); a rank whose process died leaves no traceback: see run.error and run.logs().")
            else:
                msg = (f"Run {self.name!r} has no failed rank to debug: it is {summary.get('state')}, and no rank "
                       f"raised. run.debug() opens the traceback of a rank that raised.")
            raise NbtrainError(msg)
        if rank is None:
            latest = max(f["attempt"] for f in raised)
            in_latest = [f for f in raised if f["attempt"] == latest]
            first = next((f for f in in_latest if not f.get("secondary")), in_latest[0])
            return int(latest), int(first["rank"])
        own = [f for f in raised if f["rank"] == rank]
        if not own:
            others = sorted({int(f["rank"]) for f in raised})
            listed = ", ".join(map(str, others))
            msg = (f"Rank {rank} of run {self.name!r} did not raise (rank{'s' if len(others) > 1 else ''} {listed} "
                   f"did): open {'one of them' if len(others) > 1 else 'it'} with "
                   f"%ray_debug {self.name} --rank {others[0]} (or run.debug(rank={others[0]})).")
            raise NbtrainError(msg)
        return int(max(f["attempt"] for f in own)), rank


def _command_list(commands: Any) -> list[str] | None:
    """``commands`` as the debugger takes them, or the error naming the parameter (before anything is shown)."""
    if commands is None:
        return None
    if isinstance(commands, str):
        return [part.strip() for part in commands.split(";")]
    if isinstance(commands, (list, tuple)) and all(isinstance(command, str) for command in commands):
        return list(commands)
    msg = (f"run.debug(commands=...) takes debugger commands as a list of strings or one string with ';' between "
           f"them, e.g. commands=\"where; p loss\"; got {commands!r}.")
    raise NbtrainError(msg)


def _check_rank(name: str, rank: Any, summary: dict[str, Any]) -> None:
    size = max([int(summary.get("world_size") or 0)] + [int(n) for n in summary.get("workers_range") or []
                                                         if isinstance(n, int)])
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < max(size, 1):
        msg = (f"Run {name!r} has no rank {rank!r}: its ranks are 0 to {max(size, 1) - 1}. "
               f"Give one of them, or no rank for the first that raised.")
        raise NbtrainError(msg)
