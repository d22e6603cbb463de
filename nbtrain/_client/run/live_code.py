"""A live run as a kernel, from the notebook: ``run.exec(source)`` runs code on its ranks between two steps,
``run.patch(source)`` rebinds definitions in its training code at one step (the kinds ``exec`` and ``patch``,
:mod:`nbtrain._cluster.command_kinds`; on the ranks, :mod:`nbtrain._cluster.rank.exec_and_patch`)."""

from __future__ import annotations

from typing import Any

from nbtrain._client.run.inspection import check_timeout, live_ranks
from nbtrain._client.run.reader import RunReader
from nbtrain._client.run.stored import READ_TIMEOUT_S
from nbtrain._cluster.commands import EXEC, PATCH
from nbtrain._exceptions import InvalidOptionError, NbtrainError


class RunLiveCode:
    """``run.exec()`` and ``run.patch()`` delegate here."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.name = reader.channel.name
        self._call = reader.channel.call
        self._steer = reader.channel.steer

    def exec(self, source: str, *, ranks: list[int] | None = None, timeout: float = 30.0,
             show_output: bool = True) -> dict[int, Any]:
        """Run ``source`` on the run's ranks at the next step boundary, in their training code's namespace.

        Every chosen rank runs it at the same step, after that step's optimizer update (or at a ``report()``
        of a loop that gives nbtrain no optimizer), while the run waits there: so it reads a DDP model that is
        the same on every rank, and a collective in it (``dist.all_reduce``) meets the other ranks' when every
        rank runs it. The namespace is the training code's: a launched function's globals and the locals of its
        frame at that step (``model``, ``optimizer``, ``loss``, the loop's ``step``), a ``%%ray_train`` cell's
        names, a script's ``__main__``. It may change objects in place (``model.eval()``); a name it assigns is
        its own (:meth:`patch` changes the code). What it prints is shown here, each line labelled by rank.

        Args:
            source: Python code; the value of its last expression is each rank's answer (as IPython shows a cell's).
            ranks: the ranks to run it on (default: every running rank).
            timeout: seconds to wait for every rank's answer. A rank still running the code after that goes on
                running it (a rank cannot drop code it runs without stopping): the run waits there, and a new
                ``exec`` is refused until it is done.
            show_output: print what each rank printed, labelled by rank.

        Returns:
            ``{rank: value}`` (a value that does not pickle comes back as its repr).

        Raises:
            InvalidOptionError: ``source`` is not valid Python, or bad ``ranks`` / ``timeout`` (nothing was sent).
            NbtrainError: the code raised on some ranks (one error naming each, with its traceback from the
                source's line; the run goes on training), a rank did not answer within ``timeout``, the run has
                ended, no rank runs, a rank has no step boundary, or an earlier exec is still running.

        Example::

            run.exec("float(model.weight.sum())")          # {0: 1.25, 1: 1.25}
            run.exec("print(loss.item())", ranks=[0])
        """
        wanted = live_ranks(self.reader, "exec", ranks)
        check_timeout("exec", timeout)
        issued = self._steer(EXEC, {"source": source, "ranks": wanted}, "sent code")
        asked = issued.ranks
        answers = self._call("command_results", issued.id, asked, float(timeout), timeout=timeout + READ_TIMEOUT_S)
        missing = [rank for rank in asked if rank not in answers]
        failed = [answers[rank][1] for rank in asked if rank in answers and not answers[rank][0]]
        if show_output:
            for rank in asked:
                if rank in answers and answers[rank][0] and answers[rank][1]["output"]:
                    print("".join(f"[rank {rank}] {line}\n" for line in answers[rank][1]["output"].splitlines()),
                          end="")
        if failed:
            raise NbtrainError(f"Run {self.name!r}: the code raised on rank(s) "
                               f"{[rank for rank in asked if rank in answers and not answers[rank][0]]}; the run goes "
                               "on training.\n\n" + "\n\n".join(failed))
        if missing:
            raise NbtrainError(f"Run {self.name!r}: rank(s) {missing} did not finish the code within {timeout:g} s. "
                               "It goes on running there (a rank cannot drop code it runs without stopping) and the "
                               "run waits at that step until it is done; a new exec() is refused until then. Wait, "
                               "or run.stop().")
        return {rank: answers[rank][1]["value"] for rank in asked}

    def patch(self, source: str, *, new: bool = False, timeout: float = 30.0) -> int:
        """Rebind the definitions in ``source`` in the run's training code, at one step on every rank.

        ``source`` is compiled here first (a syntax error is refused before anything is sent); at the next step
        boundary every rank runs it in its training code's globals (the launched function's module, the
        ``%%ray_train`` cell, the script), so the next lookup of each name it defines uses the new one:
        the loop's ``augment()``, ``loss_fn()`` or ``log_every`` change at the same step on every rank. A name
        the loop bound locally (``f = augment`` before the loop) keeps the old definition: the loop must look the
        name up. The patch is a change in the run's history and on its curves; a rewind keeps it, a restarted
        attempt applies it again (from the step it first applied at), and :meth:`fork` inherits it.

        Args:
            source: definitions: ``def``, ``class``, ``NAME = ...``, imports.
            new: also add names the training code does not have yet (else they are refused).
            timeout: seconds to wait for every rank to have rebound them.

        Returns:
            The step after whose update the patch applied (the next steps use it).

        Raises:
            InvalidOptionError: ``source`` is not valid Python or defines nothing, or the training code has no
                such name (the message lists the names it has) and ``new`` is False. Nothing was rebound.
            NbtrainError: the run cannot take it now, a definition raised as it ran, or no answer within
                ``timeout``.

        Example::

            run.patch('''
            def scale(x):
                return 0.5 * x
            ''')
        """
        check_timeout("patch", timeout)
        live_ranks(self.reader, "patch", None)  # an ended run is refused here
        issued = self._steer(PATCH, {"source": source, "new": new}, "patched")
        world = int(self.reader.summary.get("world_size") or 1)
        answers = self._call("command_results", issued.id, list(range(world)), float(timeout),
                             timeout=timeout + READ_TIMEOUT_S)
        if 0 in answers and not answers[0][0]:
            said = answers[0][1]
            if isinstance(said, dict):  # the ranks' code lacks a name: nothing was rebound
                raise InvalidOptionError(f"run.patch(): {said['refused']}")
            raise NbtrainError(f"Run {self.name!r} was not patched: {said}")
        failed = [str(value) for _rank, (ok, value) in sorted(answers.items()) if not ok]
        if failed:
            raise NbtrainError(f"Run {self.name!r}: the patch failed on some ranks:\n\n" + "\n\n".join(failed))
        if 0 not in answers:
            raise NbtrainError(f"Run {self.name!r}: rank 0 did not apply the patch within {timeout:g} s (it applies at "
                               "the next step boundary; a paused run has none until resumed).")
        return int(answers[0][1])
