"""The :class:`Run` handle the notebook holds: one run on the cluster, made of parts.

A ``Run`` holds a :class:`~nbtrain._client.run.reader.RunReader` (what was read of the run, and the channel to
its supervisor) and the parts that act on it, each given the reader and nothing else: ``RunControl`` (stop,
steer, the record of changes), ``RunFiles`` (whole history, logs, result, checkpoints), ``RunInspection``
(stacks, profile) and ``RunDebugging`` (post-mortems). Its public methods delegate to them; views read the run
through ``run.reader``. Reading never writes: not the registry, not a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nbtrain import _registry
from nbtrain._client import views
from nbtrain._client.run.control import _UNSET, RunControl
from nbtrain._client.run.debugging import RunDebugging
from nbtrain._client.run.files import RunFile, RunFiles
from nbtrain._client.run.inspection import PROFILE_WAIT_S, RunInspection
from nbtrain._client.run.inspection_results import Profile, Stacks
from nbtrain._client.run.live_code import RunLiveCode
from nbtrain._client.run.reader import POLL_TIMEOUT_S as POLL_TIMEOUT_S
from nbtrain._client.run.reader import ROW_WINDOW as ROW_WINDOW
from nbtrain._client.run.reader import RunReader, SupervisorChannel
from nbtrain._client.run.reader import _readable as _readable
from nbtrain._client.run.rewinds import RunRewinds
from nbtrain._client.run.row_rules import RowRule
from nbtrain._client.run.stored import StoredRunHandle
from nbtrain._cluster.launch_phases import timeline
from nbtrain._cluster.names import wait_until_name_free
from nbtrain._exceptions import NbtrainError, RunFailedError
from nbtrain._states import RunState

_made_here: list[Run] = []  # the newest Run this process made: launch(), fork(), attach(), the magics all make one
_F = TypeVar("_F", bound=Callable[..., Any])


def last_run_here() -> Run | None:
    """The run this kernel last started, forked or attached, from Python or a magic: what ``%ray_debug`` and
    ``%ray_stop`` take when no name is given."""
    return _made_here[0] if _made_here else None


def _doc_of(part_method: Any) -> Callable[[_F], _F]:
    """Give a delegating method of :class:`Run` the docstring of the part's method it calls (one text for both)."""
    def give(delegate: _F) -> _F:
        delegate.__doc__ = part_method.__doc__
        return delegate
    return give


class Run:
    """A training run on the cluster. Get one from :func:`launch` or :func:`attach`.

    Reading ``state``, ``metrics``, ``workers`` or ``logs()`` fetches what is new
    from the run's supervisor (a few milliseconds), so they are always current; once
    the run has ended and its supervisor exited, the run's files answer instead.
    Whatever asks the cluster raises :class:`RunNotFoundError` if the run is gone
    (deleted, or its files lost); these reads raise :class:`NbtrainError` if its
    supervisor does not answer within 15 s. ``name`` is the run's name on the cluster.

    Example::

        run = nbtrain.launch(train, workers=2)
        run.dashboard()
        run.wait()
    """

    def __init__(self, name: str, handle: Any, address: str) -> None:
        self.name = name
        self._channel = SupervisorChannel(name, handle, address)
        self._reader = RunReader(self._channel)
        self._control = RunControl(self._reader)
        self._files = RunFiles(self._reader)
        self._inspection = RunInspection(self._reader)
        self._live_code = RunLiveCode(self._reader)
        self._debugging = RunDebugging(self._reader)
        self._rewinds = RunRewinds(self._reader)
        self._row_rule = RowRule(self._reader)
        _made_here[:] = [self]

    # ------------------------------------------------------------------ reading
    @property
    def reader(self) -> RunReader:
        """What the notebook has read of this run, for views that draw it without asking the cluster each time:
        ``summary`` (as of the last read), ``rows_since(index)``, ``logs_since(index)``, ``events``,
        ``caught_up``, and ``refresh(wait_s)`` to fetch what is new. Rows and log chunks keep their index in
        the run's history, so a view that remembers where it got to misses nothing and sees nothing twice.

        Example::

            seen = 0
            while not run.reader.summary.get("ended"):
                run.reader.refresh(wait_s=1.0)
                new = run.reader.rows_since(seen); seen += len(new)
        """
        return self._reader

    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Fetch what is new: up to one page of metric rows, every new log chunk and event, and the current
        summary. One page, so the notebook's memory stays bounded however far behind it is.

        Args:
            wait_s: when > 0, a long poll: wait up to this long for something new to arrive.

        Returns:
            The metric rows new since the last refresh (by any reader of this Run).

        Example::

            new_rows = run.refresh(wait_s=5)
        """
        return self._reader.refresh(wait_s)

    def _call(self, method: str, *args: Any, timeout: float = POLL_TIMEOUT_S) -> Any:
        """Ask the run's supervisor (or its files): for the other modules of this package, e.g. forking."""
        return self._channel.call(method, *args, timeout=timeout)

    def _fresh_summary(self) -> dict[str, Any]:
        return self._reader.fetch_summary()

    @property
    def state(self) -> RunState:
        """The run's :class:`RunState` now: ``pending``, ``starting``, ``running``, ``restarting``, ``succeeded``,
        ``failed`` or ``stopped`` (the last three are terminal: ``run.state.is_terminal``)."""
        return self._control.state

    @property
    @_doc_of(RunFiles.metrics)
    def metrics(self) -> list[dict[str, Any]]:
        return self._files.metrics

    @property
    def workers(self) -> list[dict[str, Any]]:
        """One dict per rank: node, pid, device, state, step, samples/s, memory, heartbeat age, and
        ``malloc_tuned`` (whether the rank keeps freed memory for its next step; see the performance guide)."""
        return list(self._reader.fetch_summary()["workers"])

    @property
    def error(self) -> str | None:
        """Every failing rank with its traceback, as text, or ``None``."""
        error: str | None = self._reader.fetch_summary()["error"]
        return error

    @property
    @_doc_of(RunControl.config)
    def config(self) -> dict[str, Any]:
        return self._control.config

    @property
    def attempt(self) -> int:
        """Which attempt the run is on: 1 for the first (0 before it starts), one more each time it starts again
        from a checkpoint (after a failure, an elastic resize, or ``resume=True``)."""
        return int(self._reader.fetch_summary()["attempt"])

    @property
    def events(self) -> list[dict[str, Any]]:
        """State changes, failures, restarts, stalls and checkpoints, in order, one dict each."""
        self._reader.refresh()
        return self._reader.events

    def summary(self) -> dict[str, Any]:
        """The run's summary now, as the dashboard and the sidebar read it (a copy).

        Returns:
            A dict with, among others, ``state``, ``attempt``, ``step`` (the slowest rank's), ``world_size``,
            ``workers``, ``error``, ``parent`` (a forked run's ``{"run", "step"}``), ``latest`` (the last
            values reported), ``started``, ``ended`` and ``launch_phases`` (see :meth:`timeline`).
        """
        return self._reader.fetch_summary()

    def timeline(self) -> dict[str, float]:
        """Where the launch's time went: seconds from the ``launch()`` call to the end of each phase reached so far.

        In the order they happen: ``supervisor_up`` (the run's supervisor actor made), ``ranks_assigned`` (every
        rank's worker leased warm or started, and placed), ``group_formed`` (``torch.distributed`` joined on every
        rank), ``function_loaded`` (the training function unpickled on every rank), ``first_step`` (the first
        ``report()`` on every rank) and ``first_row`` (this notebook got the first metric row; only for the
        :class:`Run` that ``launch()`` returned). Each is read from the clock of the process where it happened,
        the first attempt's only. How many ranks were lent warm: ``summary()["launch_phases"]["warm_ranks"]``.

        Returns:
            ``{phase: seconds}``; empty for a sweep's trial or a run started by an older nbtrain.

        Example::

            >>> run = nbtrain.launch(train, workers=2)
            >>> run.wait()
            >>> run.timeline()
            {'supervisor_up': 0.21, 'ranks_assigned': 0.35, 'group_formed': 0.52, 'function_loaded': 0.53,
             'first_step': 0.61, 'first_row': 0.83}
        """
        return timeline(self._reader.fetch_summary().get("launch_phases"), self._reader.first_row_at)

    @_doc_of(RunFiles.metrics_frame)
    def metrics_frame(self) -> Any:
        return self._files.metrics_frame()

    @_doc_of(RunFiles.logs)
    def logs(self, rank: int | None = None) -> str:
        return self._files.logs(rank)

    @property
    @_doc_of(RunFiles.result)
    def result(self) -> list[Any] | None:
        return self._files.result

    @_doc_of(RunFiles.load_checkpoint)
    def load_checkpoint(self, *, weights_only: bool = True) -> Any | None:
        return self._files.load_checkpoint(weights_only=weights_only)

    @_doc_of(RunFiles.checkpoint_dir)
    def checkpoint_dir(self) -> Path | None:
        return self._files.checkpoint_dir()

    @_doc_of(RunFiles.files)
    def files(self) -> list[RunFile]:
        return self._files.files()

    @_doc_of(RunFiles.download)
    def download(self, name_or_pattern: str, to: str | os.PathLike[str] = ".") -> list[Path]:
        return self._files.download(name_or_pattern, to)

    # ------------------------------------------------------------------ looking inside
    @_doc_of(RunDebugging.debug)
    def debug(self, rank: int | None = None, *, commands: list[str] | str | None = None, stdout: Any = None) -> None:
        self._debugging.debug(rank, commands=commands, stdout=stdout)

    @_doc_of(RunInspection.stacks)
    def stacks(self, *, ranks: list[int] | None = None, timeout: float = 10.0) -> Stacks:
        return self._inspection.stacks(ranks=ranks, timeout=timeout)

    @_doc_of(RunInspection.profile)
    def profile(self, steps: int = 20, *, ranks: list[int] | None = None, timeout: float = PROFILE_WAIT_S) -> Profile:
        return self._inspection.profile(steps, ranks=ranks, timeout=timeout)

    @_doc_of(RunLiveCode.exec)
    def exec(self, source: str, *, ranks: list[int] | None = None, timeout: float = 30.0,
             show_output: bool = True) -> dict[int, Any]:
        return self._live_code.exec(source, ranks=ranks, timeout=timeout, show_output=show_output)

    @_doc_of(RunLiveCode.patch)
    def patch(self, source: str, *, new: bool = False, timeout: float = 30.0) -> int:
        return self._live_code.patch(source, new=new, timeout=timeout)

    # ------------------------------------------------------------------ control
    @_doc_of(RunControl.stop)
    def stop(self, timeout: float = 30.0, *, after: str | None = None) -> RunState:
        return self._control.stop(timeout, after=after)

    @_doc_of(RunControl.drain)
    def drain(self, node: str, deadline_s: float = 120.0) -> str:
        return self._control.drain(node, deadline_s)

    @_doc_of(RunControl.adjust)
    def adjust(self, *, lr: float | None = None, weight_decay: float | None = None, momentum: float | None = None,
               betas: tuple[float, float] | None = None, grad_clip: float | None = _UNSET,
               group: int | None = None, wait: bool = False, **others: Any) -> int | None:
        return self._control.adjust(lr=lr, weight_decay=weight_decay, momentum=momentum, betas=betas,
                                    grad_clip=grad_clip, group=group, wait=wait, **others)

    @_doc_of(RunControl.pause)
    def pause(self, *, wait: bool = False) -> int | None:
        return self._control.pause(wait=wait)

    @_doc_of(RunControl.resume)
    def resume(self) -> None:
        self._control.resume()

    @_doc_of(RunControl.checkpoint_now)
    def checkpoint_now(self, *, wait: bool = False) -> int | None:
        return self._control.checkpoint_now(wait=wait)

    @_doc_of(RunControl.send)
    def send(self, command: str, /, *, ranks: str = "0", timeout: float = 60.0, **payload: Any) -> Any:
        return self._control.send(command, ranks=ranks, timeout=timeout, **payload)

    @property
    @_doc_of(RunControl.changes)
    def changes(self) -> list[dict[str, Any]]:
        return self._control.changes

    @_doc_of(RunControl.config_at)
    def config_at(self, step: int) -> dict[str, Any]:
        return self._control.config_at(step)

    @_doc_of(RunRewinds.rewind)
    def rewind(self, step: int | None = None, skip_batches: int = 0, *, wait: bool = False) -> int:
        return self._rewinds.rewind(step, skip_batches, wait=wait)

    @_doc_of(RunRewinds.guard)
    def guard(self, **settings: Any) -> dict[str, Any]:
        return self._rewinds.guard(**settings)

    @property
    @_doc_of(RunRewinds.guards)
    def guards(self) -> dict[str, Any]:
        return self._rewinds.guards

    @property
    @_doc_of(RunRewinds.rewinds)
    def rewinds(self) -> list[dict[str, Any]]:
        return self._rewinds.rewinds

    def on_row(self, callback: Callable[[dict[str, Any]], Any] | None) -> None:
        """Call ``callback(row)`` with each metric row of this run as it arrives, to steer it by a rule written in
        the notebook: the callback may call :meth:`adjust`, :meth:`pause`, :meth:`rewind`, :meth:`send` or
        :meth:`stop`. Rows come in order, on the dashboard's following thread when a view follows the run (else
        on a thread of the rule's own), from the next one fetched on; a row the run already knows a rewind left
        (a rank's row from before it went back, arriving late) is not handed over. A callback that raises is
        shown once, with its traceback, and detached; the run is never touched by it. One callback per ``Run``:
        a new one replaces it; ``None`` detaches.

        Args:
            callback: a function of one row (a dict: ``rank``, ``step``, ``attempt``, ``time`` and the metrics),
                or ``None``.

        Raises:
            InvalidOptionError: ``callback`` is neither callable nor None.

        Example::

            best = {"loss": float("inf"), "step": 0}
            def lower_on_plateau(row):
                if row["rank"] == 0 and row["loss"] < best["loss"]:
                    best.update(loss=row["loss"], step=row["step"])
                elif row["rank"] == 0 and row["step"] - best["step"] > 200:
                    run.adjust(lr=run.config_at(row["step"])["lr"] / 2)
                    best["step"] = row["step"]
            run.on_row(lower_on_plateau)
        """
        self._row_rule.set(callback)

    def fork(self, *, step: int | None = None, config: dict[str, Any] | None = None, name: str | None = None,
             train_fn: Any = None, patches: bool = True, **options: Any) -> Any:
        """Launch a new run from this run's checkpoint, with ``config`` changed: to try another setting
        from a point this run reached without starting over. Works on live and ended runs.

        The new run's ranks get the parent's checkpoint from :func:`load_checkpoint`; it records its parent
        and the step (its dashboard header and the sidebar show them).

        Args:
            step: start from the latest checkpoint kept at or before this step; ``None`` for the latest.
            config: the config values to change (merged over the parent's).
            name: the new run's name; default ``<this run>-fork-<time>``.
            train_fn: a different training function; default the parent's.
            patches: apply the parent's :meth:`patch` es to the fork's code too (from its first step boundary);
                False: the code as launched.
            **options: any other run option of :func:`launch`, e.g. ``workers=4``. A run's Ray Datasets are
                kept nowhere: a fork of a run launched with ``datasets=`` is given them again, under the same
                names (``datasets={"train": ds}``). The parent's uploaded ``runtime_env`` folders are used
                again; a ``runtime_env=`` given here is uploaded as :func:`launch` uploads it.

        Returns:
            The new :class:`Run`, started.

        Raises:
            InvalidOptionError: ``step``, ``config`` or an option is wrong, or the parent's ``datasets=`` were not
                given again.
            NbtrainError: this run has no checkpoint to fork from (at or before ``step``), or kept no
                copy of its launch and no ``train_fn`` was given.
            RunExistsError: ``name`` is a live run's. An ended run's name is not refused: the fork is ``NAME-2``
                (``NAME-3``…), said on stderr, as with :func:`launch`.

        Example::

            child = run.fork(config={"lr": 0.01}, name="lower-lr")
            nbtrain.compare([run, child], metric="loss")
        """
        from nbtrain._client.run.forking import fork

        return fork(self, step=step, config=config, name=name, train_fn=train_fn, patches=patches, options=options)

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> RunState:
        """Block until the run ends (or ``timeout`` seconds pass) and return its state.

        Whatever happens here, Ctrl-C included, the run keeps going: only the call that launched
        a run stops it when interrupted; :meth:`stop` stops it from anywhere.

        Args:
            timeout: seconds to wait at most; ``None`` waits for the end.
            raise_on_failure: raise if the run failed; ``False`` just returns the state.

        Returns:
            The terminal :class:`RunState` (succeeded, failed or stopped).

        Raises:
            RunFailedError: the run failed (the message has every failing rank's traceback).
            TimeoutError: ``timeout`` passed first.

        Example::

            if run.wait(raise_on_failure=False) == nbtrain.RunState.FAILED:
                run.debug()
        """
        from nbtrain._client.run.following import block_until_done

        state = block_until_done(self, launched=False, timeout=timeout)
        if raise_on_failure:
            self.raise_if_failed()
        return state

    def raise_if_failed(self) -> None:
        """Raise if the run has ended failed, as of the last read (it asks nothing of the cluster).

        Raises:
            RunFailedError: the run failed (the message has every failing rank's traceback).
        """
        summary = self._reader.summary
        if summary.get("state") == RunState.FAILED:
            raise RunFailedError(f"Run {self.name!r} failed.\n{summary.get('error')}")

    def delete(self, timeout: float = 30.0) -> None:
        """Delete an ended run: its stored history, checkpoints and state, its supervisor, its registry record.

        Deleting is not undoable, so it never stops a run on the way. Afterwards the name is free,
        and launching it again starts a new run from step 0.

        Args:
            timeout: seconds to wait for the supervisor to delete the files.

        Raises:
            NbtrainError: the run is still going (nothing was deleted): :meth:`stop` it first.

        Example::

            run.stop(); run.delete()
        """
        import ray

        outcome = self._call("delete", timeout=timeout)
        if outcome == "retired":  # the run had just ended and its supervisor is exiting: delete its files
            wait_until_name_free(self.name)
            outcome = self._call("delete", timeout=timeout)
        if outcome != "deleted":
            msg = (f"Run {self.name!r} is still {outcome}, so nothing was deleted. Stop it first with "
                   f"run.stop() (or `nbtrain stop {self.name}`), then delete it.")
            raise NbtrainError(msg)
        _registry.forget_run(self.name, self._channel.address)
        if isinstance(self._channel.handle, StoredRunHandle):  # no process to end: the files were the run
            return
        ray.kill(self._channel.handle, no_restart=True)
        wait_until_name_free(self.name)  # a launch of the name may follow

    def dashboard(self, **options: Any) -> Any:
        """Show the live dashboard: widgets in a notebook, a text progress line elsewhere.

        Showing it again from the same cell closes the one that cell showed before; :meth:`close` ends them all.

        Args:
            **options: ``follow="background"`` (a thread redraws; the default) or ``"none"``, and ``ranks``:
                in a wide run, the ranks drawn as lines of their own (``ranks=[0, 17]``).

        Returns:
            The view shown.

        Example::

            run.dashboard(ranks=[0, 3])
        """
        return views.open_view(views.RUN_DASHBOARD, self, **options)

    def figure(self, metrics: str | list[str] | None = None) -> Any:
        """The run's history as a plotly figure, to zoom, hover, restyle or export (``write_html``, ``write_image``).

        One subplot per metric: a thin translucent line per rank and a thick dark one for the mean across ranks
        (a run of more than 8 ranks: the mean and its min-max band); the branches its rewinds left, faded; its
        marks (changes, rewinds, resizes, restarts, patches, guard trips) as labelled vertical lines. Each trace
        is downsampled to at most 2,000 points as the dashboard's curves are (each stretch's first, lowest,
        highest and last point kept), so a run of millions of rows draws at once. A metric that only counts
        (``epoch``) is said in the title, not drawn (unless named); one reported more rarely than the run's
        steps (``epoch_loss``) is drawn as points, and no line crosses a gap in a metric's reports. A live run's
        figure is its history so far; an ended run's is read from its files. In a notebook it shows without
        putting a copy of plotly.js in the saved file.

        Args:
            metrics: a metric's name or a list of them, in the order drawn; ``None``: every metric but counters.

        Returns:
            A ``plotly.graph_objects.Figure`` (a run with no rows yet: an empty one whose title says so).

        Raises:
            InvalidOptionError: a metric the run does not report (a ``ValueError``; the message lists those it does).

        Example::

            fig = run.figure(["loss", "val_loss"])
            fig.write_html("loss.html")
        """
        return views.open_view(views.RUN_FIGURE, self, metrics)

    def close(self) -> None:
        """End this Run's live views (its dashboards) within a second; what they drew stays, and the run goes on."""
        self._reader.close_views()

    def __repr__(self) -> str:
        summary = self._reader.summary
        state = summary.get("state", "?")
        rows = self._reader.rows_fetched
        return f"<nbtrain.Run {self.name!r} {state}, attempt {summary.get('attempt', '?')}, {rows} rows>"
