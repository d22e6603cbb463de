"""What a run keeps beyond its live summary, read when asked: every metric row as one DataFrame, the
workers' printed output, the training function's return values, its checkpoints, the files its ranks wrote.

:class:`RunFiles` is the part of :class:`~nbtrain.Run` that fetches these whole, page by page (the run's
:class:`~nbtrain._client.run.reader.RunReader` holds only a window of the latest rows and log chunks); it only reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import cloudpickle

from nbtrain._client.run import written
from nbtrain._client.run.checkpoint_files import load_in_notebook, local_checkpoint_dir
from nbtrain._client.run.history_branches import rewinds_of, superseded_column
from nbtrain._client.run.reader import RunReader
from nbtrain._client.run.stored import READ_TIMEOUT_S

FRAME_PAGE_ROWS = 500_000  # rows per Arrow page of metrics_frame(): ~150 MB of supervisor memory at most


class RunFiles:
    """A run's whole history and outputs: ``run.metrics``, ``run.logs()``, ``run.result``... delegate here."""

    def __init__(self, reader: RunReader) -> None:
        self.reader = reader
        self.name = reader.channel.name
        self._call = reader.channel.call
        self._result: list[Any] | None = None

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every row reported so far, in order, as dicts: ``rank``, ``step``, ``attempt``, ``time`` and the values.

        A long run's older rows are fetched from the cluster page by page (the Run keeps only
        the latest); for millions of rows :meth:`metrics_frame` is faster and far smaller.

        Example::

            losses = [row["loss"] for row in run.metrics if row["rank"] == 0 and "loss" in row]
        """
        return self.reader.all_rows()

    def metrics_frame(self) -> Any:
        """Every row reported so far as a pandas DataFrame, for long runs where :attr:`metrics` is slow.

        Built from Arrow pages the cluster sends: no Python object per row, so millions of rows load
        in seconds.

        Returns:
            A ``pandas.DataFrame`` with columns ``rank``, ``step``, ``attempt``, ``time``, one per
            metric (empty, with those four columns, before the first report), and ``superseded``: True for
            the rows of a branch a :meth:`rewind` went back from.

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
            return pa.table({"rank": [], "step": [], "attempt": [], "time": [], "superseded": pa.array([], pa.bool_())
                             }).to_pandas()
        frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
        frame["superseded"] = superseded_column(frame, rewinds_of(self.reader.fetch_summary()))
        return frame

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
        entries = self.reader.all_logs()
        chunks = [entry for entry in entries if rank is None or entry["rank"] == rank]
        if rank is not None:
            return "".join(entry["text"] for entry in chunks)
        return "".join(f"[rank {entry['rank']}] {line}\n" for entry in chunks
                       for line in entry["text"].splitlines() if line.strip())

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

    def files(self) -> list[written.RunFile]:
        """The files the run's ranks wrote in the folder they worked in, on every node that ran ranks.

        On the embedded cluster the ranks work in the notebook's folder: the files modified there while
        the run went are listed. Elsewhere (a remote cluster, another machine) they work in the run's own
        folder on their node, ``files/`` in its run directory: all its files are listed. A file's name is
        its path relative to that folder; ``ranks`` are the ranks that worked there (a node's ranks share
        its folder, as under torchrun).

        Returns:
            A list of ``RunFile`` (``name``, ``size``, ``modified``, ``ranks``, ``node``, ``folder``), by name.

        Raises:
            NbtrainError: a node that ran ranks has left the cluster (its files with it), or the run's
                ``runtime_env`` has a ``working_dir`` (Ray's copy is the ranks' folder; nbtrain does not track it).

        Example::

            [f.name for f in run.files()]        # ['metrics.csv', 'plots/loss.png']
            run.download("plots/*.png", to="results")
        """
        return written.list_files(self.name, self.reader.fetch_summary())

    def download(self, name_or_pattern: str, to: str | os.PathLike[str] = ".") -> list[Path]:
        """Bring files the run's ranks wrote (see :meth:`files`) to this machine, from a remote cluster too.

        Args:
            name_or_pattern: a file's name as :meth:`files` lists it (``"plots/loss.png"``) or a pattern
                (``"*.csv"``, ``"plots/*"``); a name that leads outside the run's folder (absolute, ``..``)
                is refused.
            to: the folder the files land in, keeping their relative paths (made if missing). A name that
                more than one node's ranks wrote lands once per node, under the node's name.

        Returns:
            The paths written, each whole (written under a temporary name, then renamed). A large
            download shows a progress bar.

        Raises:
            InvalidOptionError: ``name_or_pattern`` leads outside the run's folder.
            NbtrainError: no file matches (the message lists some that do exist), or a node has gone.

        Example::

            paths = run.download("*.csv", to="results")
        """
        summary = self.reader.fetch_summary()
        picked = written.chosen(self.name, written.list_files(self.name, summary), name_or_pattern)
        return written.download(self.name, summary, picked, to)
