"""Rewinding a live run in place and guarding it against divergence, from the notebook: ``run.rewind()``,
``run.guard()``, ``run.guards``, ``run.rewinds`` (see :mod:`nbtrain._cluster.rank.rewinding` for the ranks' side
and :mod:`nbtrain._guards` for the guards').

A rewind leaves the branch it goes back from in the run's history: the rows reported past the restore
point before the rewind are *superseded* (the run's history model decides which: :mod:`.run_history`; the
``superseded`` column of ``run.metrics_frame()``), and its mark says ``rewound to step N``.
"""

from __future__ import annotations

from typing import Any

from nbtrain._client.run.control import applied
from nbtrain._client.run.reader import RunReader
from nbtrain._cluster.commands import GUARD, REWIND
from nbtrain._cluster.storage.history_rules import branches_of
from nbtrain._exceptions import InvalidOptionError
from nbtrain._guards import checked_guard
from nbtrain._registry import is_whole


class RunRewinds:
    """``run.rewind()`` and ``run.guard()`` delegate here."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.name = reader.channel.name

    def rewind(self, step: int | None = None, skip_batches: int = 0, *, wait: bool = False) -> int:
        """Take every rank of the live run back to its latest checkpoint at or before ``step``, in place.

        The same processes and process group go on from there: each rank restores its prepared model,
        the optimizers nbtrain steers, their LR schedulers, the RNGs and each ``prepare_loader`` loader's
        place, at the same step as the others, then skips the next ``skip_batches`` batches. Nothing is
        relaunched, reloaded or compiled again. The rows reported past that step so far stay in the
        history, marked superseded (a column of :meth:`metrics_frame`), and an event says ``rewound to
        step N``; an attempt restarted later resumes from the checkpoint the rewind went back to. Ranks
        take restore points at each ``nbtrain.save_checkpoint`` (call it on every rank) and keep the last
        two of the epoch they are in. A loop nbtrain cannot put back (its own loader, no optimizer given)
        needs an ``@nbtrain.on_rewind`` function; without one, this says what to add.

        Args:
            step: the latest step to go back to (a checkpoint at or before it is used); ``None``: the latest.
            skip_batches: batches to pass over after the checkpoint's place (e.g. through a bad batch).
            wait: return once rank 0 has rewound.

        Returns:
            The step of the checkpoint the run goes back to.

        Raises:
            InvalidOptionError: ``step`` or ``skip_batches`` is not a whole number >= 0 (nothing was sent).
            NbtrainError: the run cannot be rewound (ended, no checkpoint at or before ``step``, a loop nbtrain
                cannot restore...: the message says which), or, with ``wait=True``, the rewind did not land: the run
                ended, paused (it lands once resumed), restarted (it was dropped) or did not reach its step in 30 s.

        Example::

            run.rewind(step=1200, skip_batches=50)
        """
        if step is not None and not is_whole(step):
            raise InvalidOptionError(f"run.rewind(step=...) is a step of the run (a whole number >= 0), or None for "
                                     f"the latest checkpoint; got {step!r}.")
        if not is_whole(skip_batches):
            raise InvalidOptionError(f"run.rewind(skip_batches=...) is a whole number >= 0 of batches to pass over "
                                     f"after the checkpoint; got {skip_batches!r}.")
        command = self.reader.channel.steer(REWIND, {"step": step, "skip": skip_batches}, "rewound")
        if wait:
            applied(self.reader, command, f"the rewind to step {command.rewind[0]}", "run.rewinds")
        return command.rewind[0]

    def guard(self, **settings: Any) -> dict[str, Any]:
        """Guard the live run against divergence, checked on every rank with no round trip to the notebook.

        A non-finite loss or gradient (``nan``), or a loss above ``spike`` times its running median (of the
        rank's last 50), trips it; the run then rewinds every rank to the last checkpoint before that step,
        skipping the batches through the one that tripped (``"rewind"``), pauses or stops. An update whose
        gradients are not finite is skipped on every rank. Each trip and action is an event. After
        ``max_rewinds`` rewinds by the guards, a trip pauses the run and says why. The same settings are the
        launch option ``guard=`` and ``%%ray_train --guard nan=rewind spike=3``. Called with nothing, it turns
        the guards off.

        Args:
            **settings: ``nan`` (``"rewind"``, ``"pause"``, ``"stop"``), ``spike`` (a factor above 1),
                ``spike_action`` (default ``"rewind"``), ``lr_factor`` (the learning rate is multiplied by it at a
                guard's rewind), ``skip_batches`` (after the checkpoint; default: through the batch that tripped),
                ``max_rewinds`` (default 3), ``metric`` (default ``"loss"``).

        Returns:
            The guards now in force, every setting filled in (``{}``: off).

        Raises:
            InvalidOptionError: an unknown setting or a bad value (nothing was changed).
            NbtrainError: the run has ended.

        Example::

            run.guard(nan="rewind", spike=3.0, lr_factor=0.5, max_rewinds=3)
        """
        guard = checked_guard(settings) if settings else {}
        self.reader.channel.steer(GUARD, guard, "guarded")
        return guard

    @property
    def guards(self) -> dict[str, Any]:
        """The guards in force (every setting; ``{}`` when none), as of now."""
        return dict(self.reader.fetch_summary().get("guard") or {})

    @property
    def rewinds(self) -> list[dict[str, Any]]:
        """The run's rewinds, in order: ``to_step`` (the checkpoint's step), ``skip``, ``step`` (where the ranks
        were when they went back; None while under way), ``why`` (a guard's trip, or None for a call),
        ``attempt``, ``superseded`` (a later rewind went back before it), ``rank_times`` (rank -> when it went
        back, by its clock: its rows past ``to_step`` from before then are superseded) and ``description``."""
        return [branch.as_dict() for branch in branches_of(self.reader.fetch_summary())]
