"""What a run keeps beyond its live summary, read when asked: every metric row as one DataFrame, the
workers' printed output, the training function's return values, its checkpoints, the files its ranks wrote.

:class:`RunFiles` is the part of :class:`~nbtrain.Run` that fetches these whole, page by page (the run's
:class:`~nbtrain._client.run.reader.RunReader` holds only a window of the latest rows and log chunks); it only reads.
The files the ranks wrote (``run.files()``, ``run.download()``) are read where they lie: each node that ran ranks
answers for its own folder in a short task pinned to it (:mod:`nbtrain._cluster.storage.written_files` says which
folder and which files); a download reads a file in parts, writes it under a temporary name and renames it whole.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

import cloudpickle

from nbtrain._client.run.checkpoint_files import load_in_notebook, local_checkpoint_dir
from nbtrain._client.run.reader import RunReader
from nbtrain._client.run.stored import READ_TIMEOUT_S
from nbtrain._cluster.storage import written_files
from nbtrain._exceptions import InvalidOptionError, NbtrainError

FILES_ANSWER_S = 60.0  # one node's listing of the ranks' files, or one part of a file
PROGRESS_FROM_BYTES = 16 * 1024 * 1024  # a download at least this big shows a progress bar


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
            the rows of a branch a :meth:`rewind` went back from (a rank's rows past the step it went back to,
            reported before it went back).

        Raises:
            RunNotFoundError: the run is gone from the cluster (deleted, or its files lost).

        Example::

            frame = run.metrics_frame()
            frame[frame["rank"] == 0].plot(x="step", y="loss")
        """
        return self.reader.history().frame()

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

    def files(self) -> list[RunFile]:
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
        return list_files(self.name, self.reader.fetch_summary())

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
        picked = chosen(self.name, list_files(self.name, summary), name_or_pattern)
        return download_files(self.name, summary, picked, to)


@dataclasses.dataclass(frozen=True)
class RunFile:
    """One file a run's ranks wrote: its path relative to their folder, its size, when it was last written,
    and the node and ranks whose folder holds it."""

    name: str
    size: int
    modified: float
    ranks: tuple[int, ...]
    node: str
    folder: str

    def __repr__(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.modified))
        return f"RunFile({self.name!r}, {_size(self.size)}, ranks {','.join(map(str, self.ranks))}, {when})"


def _nodes(summary: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """node_id -> (its label, the ranks it ran), from the run's worker table."""
    nodes: dict[str, tuple[str, list[int]]] = {}
    for worker in summary.get("workers") or []:
        if worker.get("node_id"):
            nodes.setdefault(worker["node_id"], (str(worker.get("node") or worker["node_id"][:8]), []))[1].append(
                int(worker["rank"]))
    return {node: (label, tuple(sorted(ranks))) for node, (label, ranks) in nodes.items()}


@functools.cache
def _node_task(function: Any) -> Any:
    """``function`` as a Ray remote function that holds no CPU (made once: a download calls it per part)."""
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(function)


def _on_node(node_id: str, function: Any, *args: Any) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = _node_task(function).options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    return task.remote(*args)


def list_files(name: str, summary: dict[str, Any]) -> list[RunFile]:
    """What ``run.files()`` returns (see :meth:`nbtrain.Run.files`)."""
    import ray

    where = summary.get("files")
    if where is None:
        msg = (f"Run {name!r}'s ranks worked in its runtime_env's working_dir, a copy Ray made on each node: "
               "nbtrain does not keep track of what they wrote there. Write to an absolute path (or storage=) instead.")
        raise NbtrainError(msg)
    nodes = _nodes(summary)
    if not nodes:
        return []  # no rank has started yet
    until = summary.get("ended") if summary.get("state") in ("succeeded", "failed", "stopped") else None
    asked = {node: _on_node(node, written_files.list_written, where, summary.get("started"), until) for node in nodes}
    found: list[RunFile] = []
    for node, answer in asked.items():
        label, ranks = nodes[node]
        try:
            listing = ray.get(answer, timeout=FILES_ANSWER_S)
        except Exception as exc:  # noqa: BLE001 - a node gone: its files with it, said by name
            msg = (f"Node {label} (ranks {', '.join(map(str, ranks))}) of run {name!r} did not answer: "
                   f"{type(exc).__name__}. A node that left the cluster took the files its ranks wrote with it.")
            raise NbtrainError(msg) from None
        if listing["more"]:
            print(f"nbtrain: only the first {written_files.MAX_LISTED} files of {listing['folder']} on node "
                  f"{label} are listed.", file=sys.stderr)
        found += [RunFile(file_name, size, modified, ranks, label, listing["folder"])
                  for file_name, size, modified in listing["files"]]
    return sorted(found, key=lambda file: (file.name, file.ranks))


def chosen(name: str, listed: list[RunFile], name_or_pattern: str) -> list[tuple[str, RunFile]]:
    """The files of ``listed`` that ``name_or_pattern`` names (a name, or a glob such as ``"*.csv"``), with the
    relative path each lands at. A path that leads outside the run's folder is refused."""
    pure = PurePosixPath(name_or_pattern)
    if not name_or_pattern or pure.is_absolute() or ".." in pure.parts:
        msg = (f"download({name_or_pattern!r}): name a file of the run's folder by its relative path or a pattern "
               f"such as '*.csv' (run.files() lists them); absolute paths and '..' lead outside it.")
        raise InvalidOptionError(msg)
    matches = [file for file in listed if fnmatch.fnmatchcase(file.name, name_or_pattern)]
    if not matches:
        some = ", ".join(file.name for file in listed[:8]) or "none yet"
        msg = f"Run {name!r} has no file matching {name_or_pattern!r} in its folder (it has: {some})."
        raise NbtrainError(msg)
    by_name: dict[str, int] = {}
    for file in matches:
        by_name[file.name] = by_name.get(file.name, 0) + 1
    # the same name on several nodes (each node's ranks wrote their own): one copy each, named by node
    return [(file.name if by_name[file.name] == 1 else f"{file.node}/{file.name}", file) for file in matches]


def download_files(name: str, summary: dict[str, Any], files: list[tuple[str, RunFile]], to: str | os.PathLike[str],
             ) -> list[Path]:
    """Copy each of ``files`` under ``to``; what ``run.download()`` returns (see :meth:`nbtrain.Run.download`)."""
    import ray

    nodes = {label: node for node, (label, _ranks) in _nodes(summary).items()}
    target = Path(to)
    total = sum(file.size for _path, file in files)
    progress = _Progress(total, f"run {name!r}: {len(files)} file{'s' if len(files) != 1 else ''}")
    written = []
    try:
        for relative, file in files:
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            partial = destination.with_name(f".{destination.name}.nbtrain-partial")
            try:
                with partial.open("wb") as out:
                    offset = 0
                    while offset < file.size:
                        part = ray.get(_on_node(nodes[file.node], written_files.read_part, summary["files"],
                                                file.name, offset), timeout=FILES_ANSWER_S)
                        if not part:
                            break  # shorter than listed: it was cut since
                        out.write(part)
                        offset += len(part)
                        progress.advance(len(part))
                os.replace(partial, destination)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            written.append(destination)
    finally:
        progress.close()
    return written


class _Progress:
    """A bar for a download of ``PROGRESS_FROM_BYTES`` or more (tqdm's, in a notebook its widget); else nothing."""

    def __init__(self, total: int, description: str) -> None:
        self.bar: Any = None
        if total >= PROGRESS_FROM_BYTES:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=description)

    def advance(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"
