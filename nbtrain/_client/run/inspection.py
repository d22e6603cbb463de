"""Looking inside a live run: ``run.stacks()`` (where every rank is, now) and ``run.profile()`` (torch.profiler for
the next few steps) — a part each :class:`~nbtrain.Run` holds.

Both go the way of the run's other commands (:mod:`nbtrain._cluster.commands`): the supervisor numbers them and
the ranks' steering listeners learn them at once. ``stacks`` is answered by each rank on that listener's
thread, without pausing the rank; ``profile`` runs on the chosen ranks for the next ``steps`` optimizer steps
(or reports). Neither changes the run, and asking what cannot be answered (a run that has ended, a rank it
does not have, no steps) is one error line, with nothing sent to the ranks.
"""

from __future__ import annotations

from typing import Any

from nbtrain._client.run.inspection_results import Profile, Stacks
from nbtrain._client.run.reader import RunReader
from nbtrain._client.run.stored import READ_TIMEOUT_S
from nbtrain._cluster.command_kinds.table import command_kind
from nbtrain._cluster.commands import PROFILE, STACKS
from nbtrain._exceptions import InvalidOptionError, NbtrainError
from nbtrain._states import RunState

PROFILE_WAIT_S = 300.0


class RunInspection:
    """``run.stacks()`` and ``run.profile()`` delegate here."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.name = reader.channel.name
        self._call = reader.channel.call
        self._steer = reader.channel.steer

    def stacks(self, *, ranks: list[int] | None = None, timeout: float = 10.0) -> Stacks:
        """Every rank's Python stacks now, all its threads, taken from a side thread without pausing it.

        Each rank comes with one line saying where its training thread is: *waits in a collective
        (all_reduce) called from train.py:41*, *is elsewhere: train.py:37 in load (time.sleep(5))*, or
        paused. Shows as a list in the notebook (each rank's training thread open); ``print()`` it for
        text. The dashboard's Stacks button shows the same.

        Args:
            ranks: the ranks to ask (default: every running rank).
            timeout: seconds to wait for the answers; a rank that does not answer in time is named as
                such (its process is gone, or it is stuck in C code that holds Python's GIL).

        Returns:
            A ``Stacks``: ``verdicts()`` (rank → its line), ``ranks`` (rank → its threads, each with its
            frames as (file, line, function, source)), ``missing`` (the ranks that did not answer).

        Raises:
            InvalidOptionError: ``ranks`` not the run's, or a bad ``timeout`` (nothing was sent).
            NbtrainError: the run has ended, or no rank runs now (starting, restarting).

        Example::

            run.stacks()                             # every running rank
            run.stacks(ranks=[3]).ranks[3]["threads"][0]["frames"][-1]
        """
        wanted = live_ranks(self.reader, "stacks", ranks)
        check_timeout("stacks", timeout)
        issued = self._steer(STACKS, {"ranks": wanted}, "asked for its stacks")
        asked = issued.ranks
        answers = self._call("command_results", issued.id, asked, float(timeout), timeout=timeout + READ_TIMEOUT_S)
        return Stacks(self.name, asked, answers, timeout)

    def profile(self, steps: int = 20, *, ranks: list[int] | None = None, timeout: float = PROFILE_WAIT_S) -> Profile:
        """Run torch.profiler on some ranks for the next few steps, and show where the time went.

        Each profiled rank starts the profiler after an optimizer update (or a ``report()``, for loops that
        give nbtrain no optimizer) and stops after ``steps`` more; it answers with the top operators by
        self time and its Chrome trace, which the run keeps in its directory on the cluster's head node
        (for TensorBoard's profiler plugin, or ui.perfetto.dev). Blocks until every profiled rank has
        answered. While no profile runs, this costs the step nothing. The dashboard's Profile button
        runs 10 steps of rank 0.

        Args:
            steps: how many steps to profile, 1 to 1000.
            ranks: the ranks to profile (default: rank 0).
            timeout: seconds to wait for every profiled rank's answer.

        Returns:
            A ``Profile``: shows as a table per rank in the notebook (``print()`` it for text);
            ``tables`` (rank → rows of ``name``, ``calls``, ``self_cpu_us``, ``self_cpu_pct``,
            ``cpu_total_us``, and on a GPU ``self_gpu_us``, ``self_gpu_pct``), ``trace_paths``
            (rank → the gzipped trace's path on the head node), ``how_to_open()``.

        Raises:
            InvalidOptionError: bad ``steps``, ``ranks`` or ``timeout`` (nothing was sent).
            NbtrainError: the run has ended or no rank runs now; a rank is profiling already or could not
                start the profiler; no answer within ``timeout`` (a rank paused, slow, or done stepping).

        Example::

            run.profile(steps=10)                    # rank 0
            run.profile(steps=5, ranks=[0, 1]).trace_paths
        """
        command_kind(PROFILE).check({"steps": steps})  # before asking the run: nothing is sent
        wanted = live_ranks(self.reader, "profile", [0] if ranks is None else ranks)
        check_timeout("profile", timeout)
        issued = self._steer(PROFILE, {"steps": steps, "ranks": wanted}, "profiled")
        asked = issued.ranks
        answers = self._call("command_results", issued.id, asked, float(timeout), timeout=timeout + READ_TIMEOUT_S)
        missing = [rank for rank in asked if rank not in answers]
        if missing:
            raise NbtrainError(f"Run {self.name!r}: no profile from rank(s) {missing} within {timeout:g} s (a rank "
                               f"may be paused, slow, or stopped stepping before {steps} steps); give a longer "
                               "timeout, or fewer steps.")
        failed = [answers[rank][1] for rank in asked if not answers[rank][0]]
        if failed:
            raise NbtrainError("\n".join(failed))
        return Profile(self.name, steps, {rank: answers[rank][1] for rank in asked})

def live_ranks(reader: RunReader, call: str, ranks: Any) -> list[int] | None:
    """``ranks`` checked against the run (None stays None), or the one line that says why not."""
    summary = reader.fetch_summary()
    state = RunState(summary["state"])
    if state.is_terminal:
        what = {"stacks": "stacks to take", "profile": "steps to profile"}.get(call, "step to run code at")
        raise NbtrainError(f"run.{call}(): run {reader.channel.name!r} has ended ({state.value}); it has no {what} "
                           f"(run.error and run.logs() say how it ended).")
    if ranks is None:
        return None
    world = int(summary.get("world_size") or 1)
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        ranks = [ranks]
    if not isinstance(ranks, (list, tuple)) or not ranks or any(
            isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world for rank in ranks):
        raise InvalidOptionError(f"run.{call}(ranks=...) is a list of the run's ranks, 0 to {world - 1}; "
                                 f"got {ranks!r}.")
    return sorted(set(ranks))


def check_timeout(call: str, timeout: Any) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise InvalidOptionError(f"run.{call}(timeout=...) is a number of seconds above 0 (at most 3600), "
                                 f"got {timeout!r}.")

