"""A run's durable record on the supervisor's node: history, state, checkpoints.

The history — metric rows, log chunks, events — is three append-only
:class:`~nbtrain._cluster.storage.history_log.HistoryLog` s in the run's directory
(segmented JSON lines; their module docstring states the crash-safety and
fsync policy). If the supervisor's process dies, Ray restarts it and the logs
give back everything recorded, each record at the same index, so a notebook's
cursor continues where it was. :meth:`RunStorage.save_state` fsyncs the
history before it records a change of the run's state, so a state file never
claims more history than the disk holds.

The run's directory is 0700 and its files 0600 (metrics and checkpoints are the
user's alone; see :mod:`nbtrain._paths`). It is in nbtrain's home on the head node,
or in ``storage=`` when that is a directory; a ``storage=`` URI holds only the
checkpoints the ranks write (see :mod:`~nbtrain._cluster.storage.storage_uri`).
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path
from typing import Any

from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.history_log import HistoryLog
from nbtrain._exceptions import NbtrainError
from nbtrain._paths import private_dir, read_json, write_atomic, write_json_atomic

KEEP_CHECKPOINTS = 2
SPEC_FILE = "spec.pkl"
HISTORY_KINDS = ("metrics", "logs", "events")
# How a checkpoint's bytes hold it, by the ``format`` in its meta: what ``nbtrain.save_checkpoint``
# wrote (``torch.save`` of an object), the files of a directory (``ray.train.report(checkpoint=)``)
# as an uncompressed tar archive, or a torch.distributed.checkpoint directory in ``storage=``
# (``save_checkpoint(sharded=True)``, see sharded_checkpoint).
CHECKPOINT_SUFFIXES = {"torch": ".pt", "directory": ".tar", "dcp": ".dcp"}
_CHECKPOINT_NAME = re.compile(r"^checkpoint-a(\d+)-s(\d+)(" + "|".join(map(re.escape, CHECKPOINT_SUFFIXES.values()))
                              + r")$")


def checkpoint_name(attempt: int, step: int, form: str = "torch") -> str:
    """The name of a checkpoint of ``attempt`` at ``step``, in the supervisor's storage or ``storage=``."""
    return f"checkpoint-a{attempt}-s{step}{CHECKPOINT_SUFFIXES[form]}"


def storage_checkpoint(storage: str, run_name: str, attempt: int, step: int, form: str) -> str:
    """Where ranks write a checkpoint in ``storage=`` (a path or a pyarrow.fs URI, see storage_uri):
    ``<storage>/<run>/checkpoints/<name>``."""
    return storage_uri.join(storage, run_name, "checkpoints", checkpoint_name(attempt, step, form))


def prune_checkpoints(latest: str, keep: str | None = None) -> None:
    """Delete the checkpoints older than the last ``KEEP_CHECKPOINTS`` in the directory of ``latest``, just written,
    except ``keep`` (the one the current attempt started from: a rank may still load it).

    Older is by (attempt, step) in the names, so a checkpoint being written after ``latest``
    is never touched; files not named as checkpoints (partial writes) are left alone.
    """
    directory, name = storage_uri.split(latest)
    order = _order(name)
    assert order is not None, latest
    kept = storage_uri.split(keep)[1] if keep else None
    older = sorted((found, entry) for entry in storage_uri.list_names(directory)
                   if (found := _order(entry)) is not None and found < order and entry != kept)
    for _, entry in older[:max(0, len(older) - (KEEP_CHECKPOINTS - 1))]:
        storage_uri.delete(storage_uri.join(directory, entry))


def _order(name: str) -> tuple[int, int] | None:
    match = _CHECKPOINT_NAME.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def checkpoint_source(data: bytes | None, path: str | None, form: str) -> bytes | str:
    """What loading a checkpoint needs on this machine: its bytes, or a path.

    ``data`` (from the supervisor) as it is; a checkpoint in a ``storage=`` directory by its
    path; one at a pyarrow.fs URI is read into bytes, except a sharded (``dcp``) directory,
    which :mod:`~nbtrain._cluster.rank.sharded_checkpoint` copies when it loads it.
    """
    if data is not None:
        return data
    assert path is not None
    if form == "dcp" or not storage_uri.is_remote(path):
        return path
    return storage_uri.read_bytes(path)


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


def checkpoint_files(form: str, data: bytes | None, path: str | None, into: str | Path) -> Path:
    """Put a checkpoint's files in the local directory ``into`` and return it: a directory checkpoint's files,
    what ``nbtrain.save_checkpoint`` saved as ``checkpoint.pt``, or a copy of a sharded one at a ``storage=`` URI
    (one in a ``storage=`` directory is read where it is: callers use its path)."""
    into = private_dir(Path(into))
    if form == "dcp":
        storage_uri.download(str(path), into)
    elif form == "directory":
        unpack_directory(checkpoint_source(data, path, form), into)
    else:
        source = checkpoint_source(data, path, form)
        storage_uri.write_bytes(str(into / f"checkpoint{CHECKPOINT_SUFFIXES[form]}"),
                                source if isinstance(source, bytes) else storage_uri.read_bytes(source))
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
        write_json_atomic(self.dir / "state.json", state, durable=True)

    def load_state(self) -> dict[str, Any] | None:
        return read_json(self.dir / "state.json")

    def write_checkpoint(self, meta: dict[str, Any], data: bytes, keep: str | None = None) -> str:
        self._writable()
        path = str(self.dir / "checkpoints" / checkpoint_name(meta["attempt"], meta["step"],
                                                              meta.get("format", "torch")))
        storage_uri.write_bytes(path, data)
        prune_checkpoints(path, keep)
        return path

    def save_spec(self, spec_bytes: bytes) -> None:
        """The launch's spec (the pickled function and its options), kept so that an ended run can be forked."""
        if self.read_only or (self.dir / SPEC_FILE).exists():
            return
        write_atomic(self.dir / SPEC_FILE, spec_bytes, durable=True)

    def close(self) -> None:
        """Close the history files (before the run's directory is deleted); safe to call twice."""
        for log in self._logs.values():
            log.close()

    def _writable(self) -> None:
        if self.read_only:
            msg = f"{self.dir} was opened read-only (RunStorage.open_existing); it cannot be written."
            raise PermissionError(msg)


def checkpoint_for_fork(latest: dict[str, Any] | None, step: int | None) -> tuple[dict[str, Any], bytes] | str:
    """A run's checkpoint to fork another run from: its latest (``step=None``), or the latest kept at or before
    ``step``, as (meta, bytes); or why there is none (a sentence naming what is kept)."""
    if latest is None:
        return "it has no checkpoint: a run forks from one (nbtrain.save_checkpoint, or run.checkpoint_now())."
    if latest.get("format") == "dcp":
        return "its checkpoint is sharded (save_checkpoint(sharded=True)); fork it by launching from its files."
    meta = kept_checkpoint(latest, latest["step"] if step is None else step)
    if meta is None:
        directory, _name = storage_uri.split(latest["path"])
        steps = ", ".join(str(found[1]) for found, _ in _kept(directory))
        return f"it keeps no checkpoint at or before step {step} (it keeps the last {KEEP_CHECKPOINTS}: steps {steps})."
    return meta, storage_uri.read_bytes(meta["path"])


def kept_checkpoint(latest: dict[str, Any] | None, step: int) -> dict[str, Any] | None:
    """The meta of the latest checkpoint kept at or before ``step`` (``latest`` itself when it is), or None."""
    if latest is None:
        return None
    if latest["step"] <= step:
        return dict(latest)
    directory, _name = storage_uri.split(latest["path"])
    earlier = [(found, entry) for found, entry in _kept(directory) if found[1] <= step]
    if not earlier:
        return None
    (attempt, at), entry = earlier[-1]
    form = next(form for form, suffix in CHECKPOINT_SUFFIXES.items() if entry.endswith(suffix))
    return {"step": at, "attempt": attempt, "format": form, "path": storage_uri.join(directory, entry)}


def drop_checkpoints_after(latest: dict[str, Any], attempt: int, step: int) -> None:
    """A rewind to ``step`` in ``attempt``: its checkpoints past ``step`` are of the branch left; never taken up."""
    directory, _name = storage_uri.split(latest["path"])
    for (at_attempt, at_step), entry in _kept(directory):
        if at_attempt == attempt and at_step > step:
            storage_uri.delete(storage_uri.join(directory, entry))


def _kept(directory: str) -> list[tuple[tuple[int, int], str]]:
    return sorted((found, entry) for entry in storage_uri.list_names(directory) if (found := _order(entry)) is not None)
