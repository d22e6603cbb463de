"""A run's durable record on the supervisor's node: history, state, checkpoints.

The history — metric rows, log chunks, events — is three append-only
:class:`~nbtrain._cluster.history_log.HistoryLog` s in the run's directory
(segmented JSON lines; their module docstring states the crash-safety and
fsync policy). If the supervisor's process dies, Ray restarts it and the logs
give back everything recorded, each record at the same index, so a notebook's
cursor continues where it was. :meth:`RunStorage.save_state` fsyncs the
history before it records a change of the run's state, so a state file never
claims more history than the disk holds.

The run's directory is 0700 and its files 0600 (metrics and checkpoints are the
user's alone; see :mod:`nbtrain._paths`).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

from nbtrain._cluster.history_log import HistoryLog
from nbtrain._exceptions import NbtrainError
from nbtrain._paths import private_dir, private_opener, read_json, write_json_atomic

KEEP_CHECKPOINTS = 2
HISTORY_KINDS = ("metrics", "logs", "events")
# How a checkpoint's bytes hold it, by the ``format`` in its meta: what ``nbtrain.save_checkpoint``
# wrote (``torch.save`` of an object), the files of a directory (``ray.train.report(checkpoint=)``)
# as an uncompressed tar archive, or a torch.distributed.checkpoint directory in ``storage=``
# (``save_checkpoint(sharded=True)``, see sharded_checkpoint).
CHECKPOINT_SUFFIXES = {"torch": ".pt", "directory": ".tar", "dcp": ".dcp"}


def checkpoint_path(directory: str | Path, attempt: int, step: int, form: str = "torch") -> Path:
    """Where a checkpoint of ``attempt`` at ``step`` is written, in the supervisor's storage or ``storage=``."""
    return Path(directory) / f"checkpoint-a{attempt}-s{step}{CHECKPOINT_SUFFIXES[form]}"


def pack_directory(directory: str | Path) -> bytes:
    """The files under ``directory`` as one tar archive (paths relative to it), for a directory checkpoint."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for entry in sorted(Path(directory).iterdir()):
            archive.add(entry, arcname=entry.name)
    return buffer.getvalue()


def unpack_directory(source: bytes | str, into: str | Path) -> Path:
    """Extract a directory checkpoint (archive bytes or the archive's path) into ``into``; returns it.

    Only plain files and directories inside ``into`` are extracted (tarfile's "data" filter).
    """
    into = private_dir(Path(into))
    fileobj = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")  # noqa: SIM115
    with fileobj, tarfile.open(fileobj=fileobj, mode="r") as archive:
        archive.extractall(into, filter="data")
    return into


def load_trusted(source: bytes | str, map_location: Any, weights_only: bool) -> Any:
    """``torch.load`` of checkpoint bytes or a path, explaining the weights-only refusal in words."""
    import pickle

    import torch

    try:
        return torch.load(io.BytesIO(source) if isinstance(source, bytes) else source,
                          map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        msg = ("The checkpoint holds objects other than tensors and plain containers, so it was not loaded "
               "(weights_only=True protects against code in untrusted pickles). Save state_dicts instead, or, "
               f"if you trust this checkpoint, load it with weights_only=False. Detail: {str(exc).splitlines()[0]}")
        raise NbtrainError(msg) from None


class RunStorage:
    """One run's directory: the supervisor's (writable) or, with :meth:`open_existing`, a reader's."""

    def __init__(self, root: str | Path, run_name: str) -> None:
        self.dir = private_dir(Path(root) / run_name)
        private_dir(self.dir / "checkpoints")
        self.read_only = False
        self._logs = {kind: HistoryLog(self.dir, kind) for kind in HISTORY_KINDS}

    @classmethod
    def open_existing(cls, directory: str | Path) -> RunStorage:
        """The run stored in ``directory``, for reading only: nothing is created or written.

        Example::

            feed = RunFeed(RunStorage.open_existing(run_dir), threading.RLock())
            feed.replay()
        """
        storage = cls.__new__(cls)
        storage.dir = Path(directory)
        if not storage.dir.is_dir():
            msg = f"{storage.dir} holds no run (it is not a directory)."
            raise FileNotFoundError(msg)
        storage.read_only = True
        storage._logs = {kind: HistoryLog(storage.dir, kind, read_only=True) for kind in HISTORY_KINDS}
        return storage

    def history(self, kind: str) -> HistoryLog:
        """The log of ``kind``: ``"metrics"``, ``"logs"`` or ``"events"``."""
        return self._logs[kind]

    def append(self, kind: str, records: list[dict[str, Any]]) -> None:
        """Append to the log of ``kind``; a failed write keeps the records pending (see :meth:`failure`)."""
        self._logs[kind].append(records)

    def failure(self) -> OSError | None:
        """Why history records are pending in memory (the disk is full...), or None when all are written."""
        return next((log.failure for log in self._logs.values() if log.pending and log.failure), None)

    def flush_pending(self) -> bool:
        """Try again to write the pending records; True when none are left."""
        return all([log.flush_pending() for log in self._logs.values()])

    def sync(self) -> bool:
        """Write pending records and fsync every log; True when nothing is pending."""
        return all([log.sync() for log in self._logs.values()])

    def save_state(self, state: dict[str, Any]) -> None:
        self._writable()
        self.sync()
        write_json_atomic(self.dir / "state.json", state)

    def load_state(self) -> dict[str, Any] | None:
        return read_json(self.dir / "state.json")

    def write_checkpoint(self, meta: dict[str, Any], data: bytes) -> str:
        self._writable()
        path = checkpoint_path(self.dir / "checkpoints", meta["attempt"], meta["step"], meta.get("format", "torch"))
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb", opener=private_opener) as handle:
            handle.write(data)
        os.replace(tmp, path)
        kept = sorted((p for p in (self.dir / "checkpoints").glob("checkpoint-*") if p.suffix != ".tmp"),
                      key=os.path.getmtime)
        for old in kept[:-KEEP_CHECKPOINTS]:
            if old != path:
                old.unlink(missing_ok=True)
        return str(path)

    def close(self) -> None:
        """Close the history files (before the run's directory is deleted); safe to call twice."""
        for log in self._logs.values():
            log.close()

    def _writable(self) -> None:
        if self.read_only:
            msg = f"{self.dir} was opened read-only (RunStorage.open_existing); it cannot be written."
            raise PermissionError(msg)
