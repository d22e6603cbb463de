"""What a run keeps beyond its live summary, read when asked: every metric row as one DataFrame, the
workers' printed output, the training function's return values, its checkpoints.

:class:`RunFiles` is the part of :class:`~nbtrain.Run` that fetches these whole, page by page (the Run
itself holds only a window of the latest rows and log chunks); like the rest of a Run it only reads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from nbtrain._client.run.checkpoint_files import load_in_notebook, local_checkpoint_dir
from nbtrain._client.run.stored import READ_TIMEOUT_S

FRAME_PAGE_ROWS = 500_000  # rows per Arrow page of metrics_frame(): ~150 MB of supervisor memory at most


class RunFiles:
    """Mixed into :class:`~nbtrain.Run`."""

    name: str
    _lock: threading.Lock
    _logs: list[dict[str, Any]]
    _log_base: int
    _cursors: tuple[int, int, int]
    _result: list[Any] | None

    if TYPE_CHECKING:
        def _call(self, method: str, *args: Any, timeout: float = ...) -> Any: ...
        def _poll(self, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]: ...
        def _catch_up(self) -> None: ...

    def metrics_frame(self) -> Any:
        """Every row reported so far as a pandas DataFrame, for long runs where :attr:`metrics` is slow.

        Built from Arrow pages the cluster sends: no Python object per row, so millions of rows load
        in seconds.

        Returns:
            A ``pandas.DataFrame`` with columns ``rank``, ``step``, ``attempt``, ``time`` and one per
            metric (empty, with those four columns, before the first report).

        Raises:
            RunNotFoundError: the run is gone from the cluster (deleted, or its files lost).

        Example::

            frame = run.metrics_frame()
            frame[frame["rank"] == 0].plot(x="step", y="loss")
        """
        import pyarrow as pa

        tables = []
        start = 0
        while True:
            data = self._call("frame_ipc", start, start + FRAME_PAGE_ROWS, timeout=READ_TIMEOUT_S)
            table = pa.ipc.open_stream(data).read_all()
            if table.num_rows:
                tables.append(table)
            if table.num_rows < FRAME_PAGE_ROWS:
                break
            start += table.num_rows
        if not tables:
            return pa.table({"rank": [], "step": [], "attempt": [], "time": []}).to_pandas()
        return pa.concat_tables(tables, promote_options="permissive").to_pandas()

    def logs(self, rank: int | None = None) -> str:
        """What the workers printed (stdout and stderr), from the first attempt on.

        Args:
            rank: one rank's output, as it printed it; ``None`` for every rank's non-blank lines,
                each prefixed ``[rank N]``.

        Returns:
            The text (``""`` before anything was printed).

        Raises:
            RunNotFoundError: the run is gone from the cluster (deleted, or its files lost).

        Example::

            print(run.logs(rank=0)[-2000:])
        """
        self._catch_up()
        with self._lock:
            entries, base, cursors = list(self._logs), self._log_base, self._cursors
        if base:  # a long run's older chunks are on the cluster only
            entries = self._fetch_logs(base, cursors) + entries
        chunks = [entry for entry in entries if rank is None or entry["rank"] == rank]
        if rank is not None:
            return "".join(entry["text"] for entry in chunks)
        return "".join(f"[rank {entry['rank']}] {line}\n" for entry in chunks
                       for line in entry["text"].splitlines() if line.strip())

    def _fetch_logs(self, stop: int, cursors: tuple[int, int, int]) -> list[dict[str, Any]]:
        """Log chunks ``[0, stop)`` from the cluster, without keeping them."""
        entries: list[dict[str, Any]] = []
        while len(entries) < stop:
            reply = self._poll(cursors[0], len(entries), cursors[2], 0.0)
            page = reply["logs"][:stop - len(entries)]
            if not page:
                break
            entries.extend(page)
        return entries

    @property
    def result(self) -> list[Any] | None:
        """What the training function returned on each rank, a list indexed by rank, once the run
        succeeded (or was stopped with ``stop(after="epoch")`` and the function returned: see
        :func:`nbtrain.stop_requested`); ``None`` until then. Fetched once, then kept.

        Example::

            accuracy = run.result[0]
        """
        if self._result is None:
            raw = self._call("result")
            if raw is not None:
                self._result = [cloudpickle.loads(item) for item in raw]
        return self._result

    def load_checkpoint(self, *, weights_only: bool = True) -> Any | None:
        """The run's latest checkpoint, loaded in the notebook (on the CPU), to evaluate or export it.

        What ``nbtrain.save_checkpoint`` saved is loaded with ``torch.load``; a sharded checkpoint comes
        as one full state dict. A checkpoint reported by Ray Train code (``ray.train.report(checkpoint=)``)
        comes back as a ``ray.train.Checkpoint`` of a local directory with its files.

        Args:
            weights_only: load only tensors and plain containers (``torch.load(weights_only=True)``).
                Pass ``False`` only for checkpoints you trust.

        Returns:
            The saved object, or ``None`` if the run saved no checkpoint.

        Raises:
            NbtrainError: the checkpoint holds other objects and ``weights_only`` is true (the message
                says how to load it).
            RunNotFoundError: the run is gone from the cluster (deleted, or its files lost).

        Example::

            state = run.load_checkpoint()
            model.load_state_dict(state["model"])
        """
        found = self._call("latest_checkpoint", timeout=READ_TIMEOUT_S)
        return None if found is None else load_in_notebook(self.name, *found, weights_only=weights_only)

    def checkpoint_dir(self) -> Path | None:
        """The latest checkpoint's files in a local directory, extracted once and then reused.

        A Ray Train checkpoint's directory as the function wrote it; what ``nbtrain.save_checkpoint``
        saved, as ``checkpoint.pt`` (``torch.save``'s file).

        Returns:
            The directory, or ``None`` if the run saved no checkpoint.

        Raises:
            RunNotFoundError: the run is gone from the cluster (deleted, or its files lost).

        Example::

            files = run.checkpoint_dir()
            sorted(p.name for p in files.iterdir())
        """
        found = self._call("latest_checkpoint", timeout=READ_TIMEOUT_S)
        return None if found is None else local_checkpoint_dir(self.name, *found)
