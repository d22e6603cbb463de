"""Acting on a live run from the notebook: stop it, move it off a node, and steer it — change its optimizer's
settings, pause it, checkpoint it now, send the ranks a command — at the same step on every rank.

:class:`RunControl` is the part of :class:`~nbtrain._client.run.handle.Run` that writes (the Run holds one and
hands it the run's :class:`~nbtrain._client.run.reader.RunReader`); every method asks the run's supervisor,
which decides the step (see :mod:`nbtrain._cluster.supervisor.run_steering`) and keeps each change in the run's history
(``run.changes``, ``run.config_at(step)``, the curves' markers).
"""

from __future__ import annotations

import time
from typing import Any

import cloudpickle

from nbtrain._client.connecting.cluster_nodes import worker_node_id
from nbtrain._client.run.reader import RunReader
from nbtrain._client.run.stored import READ_TIMEOUT_S
from nbtrain._cluster.command_kinds.table import command_kind
from nbtrain._cluster.commands import (
    ADJUST,
    AS_SOON_AS_BACK,
    CHECKPOINT,
    PAUSE,
    RESUME,
    SETTINGS,
    STOP_AFTER_EPOCH,
    USER,
    Command,
)
from nbtrain._exceptions import InvalidOptionError, NbtrainError
from nbtrain._states import RunState

APPLIED_WAIT_S = 30.0  # wait=True waits this long for rank 0 to reach the command's step
APPLIED_POLL_S = 2.0   # and looks this often at whether the run ended, paused or restarted meanwhile
TERMINAL = {state.value for state in RunState if state.is_terminal}

_UNSET: Any = object()


class RunControl:
    """Stopping, draining, steering and the record of changes: ``run.stop()``, ``run.adjust()``... delegate here."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.name = reader.channel.name
        self._call = reader.channel.call
        self._steer = reader.channel.steer

    @property
    def state(self) -> RunState:
        """The run's state now (asks the cluster)."""
        return RunState(self.reader.fetch_summary()["state"])

    def stop(self, timeout: float = 30.0, *, after: str | None = None) -> RunState:
        """Stop the run: every rank ends its function at one step, its rows up to there kept, and its process
        waits, warm, for this session's next run (a rank that does not reach that step within a few seconds,
        or a paused one, is killed instead); their resources are freed before this returns.

        Args:
            timeout: seconds to wait for the supervisor to stop the workers.
            after: ``"epoch"`` lets every rank finish the epoch it is in, then stop; the call returns at once.
                A function that checks :func:`nbtrain.stop_requested` after each epoch and returns (as
                Lightning's and Hugging Face's trainers through nbtrain do) ends the run ``stopped`` with its
                ``result``; otherwise a ``prepare_loader`` loader holds each rank at the next epoch's start
                and the run is stopped there.

        Returns:
            The run's :class:`RunState` after the call (``stopped``, or still running with ``after="epoch"``).

        Raises:
            InvalidOptionError: ``after`` is not ``"epoch"``.
            NbtrainError: the run did not stop within ``timeout``, or (with ``after``) it cannot be steered.

        Example::

            run.stop()
            run.stop(after="epoch")
        """
        import ray

        if after is not None:
            if after != "epoch":
                raise InvalidOptionError(f"run.stop(after=...) takes 'epoch', not {after!r}.")
            self._steer(STOP_AFTER_EPOCH, {}, "stopped after its epoch")
            return self.state
        try:
            self._call("stop", timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            msg = f"Run {self.name!r} did not stop within {timeout:g} s; its supervisor may be stuck."
            raise NbtrainError(msg) from None
        return self.state

    def drain(self, node: str, deadline_s: float = 120.0) -> str:
        """Give the run notice that ``node`` is about to go, as a spot instance's preemption notice.

        Ray places nothing new there (the node exits once idle, or after ``deadline_s``), the ranks see
        :func:`checkpoint_requested` turn true and save, and the elastic run goes on from that checkpoint
        without the node.

        Args:
            node: the node's Ray id, or its first 6+ characters (``cluster.nodes()`` lists them).
            deadline_s: seconds the node has left, at most.

        Returns:
            What was done, in a sentence.

        Raises:
            NbtrainError: ``node`` names no live worker node (or several, or the head), the run has ended,
                or the node cannot be drained (the message says why).

        Example::

            run.drain("3f9a1c")
        """
        node_id = worker_node_id(node, "run.drain(node=...)")
        if self.state.is_terminal:
            raise NbtrainError(f"run.drain(): run {self.name!r} has ended ({self.state}); there is nothing to move.")
        done, said = self._call("drain", node_id, float(deadline_s), timeout=READ_TIMEOUT_S)
        if not done:
            raise NbtrainError(said)
        return str(said)

    # ------------------------------------------------------------------ steering
    def adjust(self, *, lr: float | None = None, weight_decay: float | None = None, momentum: float | None = None,
               betas: tuple[float, float] | None = None, grad_clip: float | None = _UNSET,
               group: int | None = None, wait: bool = False, **others: Any) -> int | None:
        """Change the optimizer's settings of the live run, on every rank before the same step's update.

        With an LR scheduler on the optimizer, the schedule goes on from the new value: its base
        rates are scaled by the same factor. Every change is kept in the run's history
        (:attr:`changes`), drawn on the curves, and re-applied by an attempt restarted after a
        failure. The code must give nbtrain its optimizer (:func:`prepare_optimizer` or :func:`steerable`,
        or the Lightning / Hugging Face integrations); otherwise this says what to call.

        Args:
            lr: the learning rate (>= 0).
            weight_decay: the weight decay (>= 0).
            momentum: SGD's momentum (>= 0).
            betas: Adam's ``(beta1, beta2)``, each in [0, 1).
            grad_clip: clip gradients to this norm before each update; ``None`` turns clipping off.
            group: change one param group (0-based) instead of all.
            wait: return once rank 0 has applied it, with the step it did.

        Returns:
            The step at which it takes effect; ``None`` when no rank runs now (a restarting run applies
            it at its next attempt's first step).

        Raises:
            InvalidOptionError: no setting, an unknown one, or a value out of range (nothing was sent).
            NbtrainError: the run cannot be steered now (ended, or its code gave nbtrain no optimizer),
                or, with ``wait=True``, it did not land: the run ended, is paused,
                restarted (the change was dropped) or did not reach its step within 30 s (the message says which).

        Example::

            run.adjust(lr=run.config_at(run.summary()["step"])["lr"] / 10)
        """
        if others:
            raise InvalidOptionError(f"adjust() cannot change {', '.join(sorted(others))}: it changes "
                                     f"{', '.join(SETTINGS)} (per param group with group=).")
        given = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "betas": betas}
        settings = {key: value for key, value in given.items() if value is not None} \
            | ({} if grad_clip is _UNSET else {"grad_clip": grad_clip})
        command = self._steer(ADJUST, {**settings, "group": group}, "adjusted")
        asked = ", ".join(f"{key}={value!r}" for key, value in command.settings.items())
        return self._step_of(command, wait, f"adjust({asked})")

    def pause(self, *, wait: bool = False) -> int | None:
        """Hold every rank at the same step, before its update, until :meth:`resume`: to look at the run
        without losing its place. The run keeps its workers and resources, and the stall timeout does not
        count the time paused.

        Args:
            wait: return once rank 0 has paused, with the step it paused at.

        Returns:
            The step it pauses at; ``None`` when no rank runs now (it applies at the next attempt).

        Raises:
            NbtrainError: the run cannot be paused now (the message says why), or, with ``wait=True``,
                it did not land: the run ended, is paused,
                restarted (the change was dropped) or did not reach its step within 30 s (the message says which).

        Example::

            step = run.pause(wait=True); run.resume()
        """
        return self._step_of(self._steer(PAUSE, {}, "paused"), wait, "the pause")

    def resume(self) -> None:
        """Let a paused run go on (or call off a pause not reached yet).

        Raises:
            NbtrainError: the run cannot be resumed now (the message says why).
        """
        self._steer(RESUME, {}, "resumed")

    def checkpoint_now(self, *, wait: bool = False) -> int | None:
        """Ask for a checkpoint at the next step, e.g. before trying a risky :meth:`adjust`.

        :func:`checkpoint_requested` turns true on every rank until the code saves (the Lightning and
        Hugging Face integrations save on their own).

        Args:
            wait: return once rank 0 has taken the request, with the step it did.

        Returns:
            The step asked for; ``None`` when no rank runs now (it applies at the next attempt).

        Raises:
            NbtrainError: the run cannot be asked now (the message says why), or, with ``wait=True``,
                it did not land: the run ended, is paused,
                restarted (the change was dropped) or did not reach its step within 30 s (the message says which).

        Example::

            run.checkpoint_now(wait=True)
        """
        return self._step_of(self._steer(CHECKPOINT, {}, "checkpointed"), wait, "the checkpoint asked for")

    def send(self, command: str, /, *, ranks: str = "0", timeout: float = 60.0, **payload: Any) -> Any:
        """Run the ranks' ``@nbtrain.on_command(command)`` handler (see :func:`on_command`) on every rank at
        the same step, after its update, and wait for the answer: to evaluate, inspect or change the live
        model from the notebook.

        Args:
            command: the handler's name.
            ranks: ``"0"`` for rank 0's answer, ``"all"`` for every rank's.
            timeout: seconds to wait for the answers.
            **payload: keyword arguments for the handler.

        Returns:
            Rank 0's answer; with ``ranks="all"``, a list of answers by rank.

        Raises:
            InvalidOptionError: ``command`` is not a name, or ``ranks`` is not ``"0"`` or ``"all"``.
            NbtrainError: the run cannot take commands now, a rank did not answer within ``timeout``,
                or a handler raised (the message has its traceback).

        Example, on the ranks::

            @nbtrain.on_command("eval")
            def evaluate(batches=10):
                return validate(model, batches)

        and in the notebook: ``run.send("eval", batches=20)``.
        """
        if ranks not in ("0", "all"):
            raise InvalidOptionError(f"run.send(..., ranks=...) is '0' or 'all', not {ranks!r}.")
        issued = self._steer(USER, {"name": command, "payload": payload}, f"sent {command!r}")
        world = int(self.reader.summary.get("world_size") or 1)
        wanted = list(range(world)) if ranks == "all" else [0]
        answers = self._call("command_results", issued.id, wanted, float(timeout), timeout=timeout + READ_TIMEOUT_S)
        missing = [rank for rank in wanted if rank not in answers]
        if missing:
            raise NbtrainError(f"Run {self.name!r}: no answer to {command!r} from rank(s) {missing} within "
                               f"{timeout:g} s (a rank may be paused, slow, or past its last step).")
        failed = [answers[rank][1] for rank in wanted if not answers[rank][0]]
        if failed:
            raise NbtrainError("\n".join(failed))
        values = [answers[rank][1] for rank in wanted]
        return values if ranks == "all" else values[0]

    @property
    def changes(self) -> list[dict[str, Any]]:
        """Every change made to the live run (:meth:`adjust`, :meth:`pause`, :meth:`checkpoint_now`...), in order,
        one dict each: ``step`` (where it applied; ``None`` while pending), ``kind``, ``args``, ``before`` (rank 0's
        values just before) and ``description`` (``"lr 0.1 → 0.01 at step 1200"``)."""
        return [{"step": change.get("applied_step"), "kind": change["kind"], "args": change["args"],
                 "before": change.get("before"), "description": change["description"]}
                for change in self.reader.fetch_summary().get("changes") or []]

    @property
    def config(self) -> dict[str, Any]:
        """The whole ``config`` dict the run was launched (or last resumed) with; ``{}`` without one.

        Summaries and the dashboard carry only a short ``config_summary``; this asks the run for the dict.
        Changes made with :meth:`adjust` are not in it: :meth:`config_at` has them.
        """
        data = self._call("config")
        return dict(cloudpickle.loads(data) or {}) if data is not None else {}

    def config_at(self, step: int) -> dict[str, Any]:
        """The run's :attr:`config` with the optimizer settings in force at ``step``: what a change made
        with :meth:`adjust` had replaced, e.g. to fork from there with the settings it ran with.

        Args:
            step: a step of the run.

        Returns:
            The config with the changes applied up to ``step`` (each value as rank 0's first param group
            had it; ``grad_clip`` included once set).

        Example::

            run.config_at(1200)["lr"]
        """
        effective = dict(self.config)
        for change in self.changes:
            if change["kind"] != ADJUST or change["step"] is None:
                continue
            for key, value in change["args"].items():
                if key == "group":
                    continue
                if change["step"] <= step:
                    effective[key] = value
                elif key not in effective and change["before"] and change["before"].get(key):
                    effective[key] = change["before"][key][0]
        return effective

    def _step_of(self, command: Command, wait: bool, what: str) -> int | None:
        if wait:
            return applied(self.reader, command, what, "run.changes").applied_step
        return None if command.at_step == AS_SOON_AS_BACK else command.at_step


def applied(reader: RunReader, command: Command, what: str, listed_in: str) -> Command:
    """``command`` once rank 0 applied it.

    One loop for every kind that waits (``adjust``, ``pause``, ``checkpoint_now`` and ``rewind`` with
    ``wait=True``), which says why as soon as the command will not land soon instead of waiting out its time.

    Args:
        what: the command in words, as the errors name it ("the rewind to step 40", "adjust(lr=0.01)").
        listed_in: where the run says when it lands, for the error past the wait ("run.rewinds").

    Raises:
        NbtrainError: it was dropped (a restart, saying why), the run ended or is paused before rank 0 reached
            its step, or rank 0 did not reach it within :data:`APPLIED_WAIT_S`.
    """
    name = reader.channel.name
    deadline = time.monotonic() + APPLIED_WAIT_S
    while True:
        command = reader.channel.call("command_applied_yet", command.id, APPLIED_POLL_S,
                                      timeout=APPLIED_POLL_S + READ_TIMEOUT_S)
        if command.applied_step is not None:
            return command
        # its step as the supervisor has it now: the ranks move it on if one of them learnt it late
        where = "its next attempt's first step" if command.at_step == AS_SOON_AS_BACK else f"step {command.at_step}"
        if command.dropped:
            raise NbtrainError(f"Run {name!r}: {what} was not applied: {command.dropped}")
        summary = reader.fetch_summary()
        if summary.get("state") in TERMINAL:
            raise NbtrainError(f"Run {name!r} ended ({summary['state']}) before rank 0 reached {where}, where "
                               f"{what} was due.")
        if summary.get("paused_at") is not None and not command_kind(command.kind).holds_the_run:
            raise NbtrainError(f"Run {name!r} is paused at step {summary['paused_at']}: {what} applies between two "
                               "whole steps, so it lands as the run goes on (run.resume()); it is still due, nothing "
                               "was cancelled.")
        if time.monotonic() > deadline:
            raise NbtrainError(f"Run {name!r}: rank 0 did not reach {where}, where {what} is due, within "
                               f"{APPLIED_WAIT_S:g} s (its ranks are at step {summary.get('step')}: slow steps?); it "
                               f"is still due: {listed_in} says when it lands.")
