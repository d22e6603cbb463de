"""A durable, append-only list of records (JSON lines) in segment files, readable by index.

One log per kind of history (metric rows, log chunks, events) lives in
``<run dir>/<kind>/``: segments named by the index of their first record,
``000000000000.jsonl``, ``000000065536.jsonl``, ... of :data:`SEGMENT_ROWS`
records each (the last one is being filled). A record's index never changes,
so a reader's cursor stays exact across restarts of the writer.

Crash safety
    Records are written as whole lines with one ``write`` per batch. A crash in
    the middle leaves at most an incomplete (or unparsable) last line; opening
    the log for writing truncates that torn tail, so later appends never follow
    a fragment and nothing after it is lost. Opening read-only ignores the torn
    tail without touching the file.

fsync policy
    Every append goes to the OS at once (unbuffered ``write``): it survives a
    crash of the process. A segment is fsynced when it is sealed (full), and
    :meth:`HistoryLog.sync` fsyncs the segment being filled; the run's storage
    calls it at every change of the run's state and at the run's end. A crash of
    the machine loses at most what was appended since the last of those.

Write failures (disk full)
    An ``OSError`` while writing does not raise: the partial write is cut off,
    the records are kept in memory (*pending*), counted in :func:`len` and
    served by :meth:`HistoryLog.read` like the others, and written (in order)
    before the next append, or by :meth:`HistoryLog.flush_pending`.
    :attr:`HistoryLog.failure` tells the caller what went wrong meanwhile.

Test-only fault injection: while the file named by the environment variable
``NBTRAIN_FAULT_DISK_FULL`` exists, every write fails as with ``ENOSPC``
(mounting a small filesystem to fill needs privileges a test does not have).

Runs recorded before segments (one ``<kind>.jsonl`` file) are still read, up to
the file's first unparsable line as before: read-only in place; opened for
writing, the file is cut there and renamed to be the log's first segment.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nbtrain import _json
from nbtrain._paths import fsync_dir, private_dir, private_opener

SEGMENT_ROWS = 65_536
CACHED_INDEXES = 4  # line-offset indexes of sealed segments kept (8 bytes per record each)
FAULT_DISK_FULL_ENV = "NBTRAIN_FAULT_DISK_FULL"
NEWLINE = 10


@dataclass
class _Segment:
    first: int   # index of its first record
    path: Path
    size: int    # bytes of whole, valid lines
    count: int   # records


class HistoryLog:
    """The records of one kind, on disk from ``directory / kind``; see the module docstring.

    Example::

        log = HistoryLog(run_dir, "metrics")
        log.append([{"rank": 0, "step": 1, "loss": 0.5}])
        log.read(0, 1)  # [{'rank': 0, 'step': 1, 'loss': 0.5}]
    """

    def __init__(self, directory: Path, kind: str, *, read_only: bool = False,
                 segment_rows: int = SEGMENT_ROWS) -> None:
        self.dir = directory / kind
        self.read_only = read_only
        self._segment_rows = segment_rows
        self._lock = threading.Lock()
        self._pending: list[bytes] = []       # encoded lines not yet written
        self._pending_records: list[dict[str, Any]] = []
        self.failure: OSError | None = None   # the last write's error, until a write succeeds
        self._fd: int | None = None
        self._ends = array("q")               # line-end offsets of the last segment
        self._indexes: OrderedDict[Path, np.ndarray[Any, Any]] = OrderedDict()
        legacy = directory / f"{kind}.jsonl"
        if not self.dir.exists() and legacy.exists():
            self._segments = [self._open_legacy(legacy)]
        else:
            self._segments = self._scan()
        if not read_only:
            private_dir(self.dir)
            if not self._segments:
                self._segments = [_Segment(0, self._segment_path(0), 0, 0)]
            self._open_last()

    # ------------------------------------------------------------------ opening
    def _segment_path(self, first: int) -> Path:
        return self.dir / f"{first:012d}.jsonl"

    def _scan(self) -> list[_Segment]:
        try:
            names = sorted(p for p in self.dir.glob("*.jsonl") if p.stem.isdigit())
        except OSError:
            return []
        segments = [_Segment(int(p.stem), p, -1, -1) for p in names]
        for before, after in itertools.pairwise(segments):  # sealed: their count is in the names
            before.count = after.first - before.first
            before.size = before.path.stat().st_size
        if segments:
            last = segments[-1]
            data = last.path.read_bytes()
            ends = _valid_line_ends(data)
            last.count, last.size = len(ends), int(ends[-1]) + 1 if len(ends) else 0
            self._ends = array("q", ends.tolist())
        return segments

    def _open_legacy(self, path: Path) -> _Segment:
        """A ``<kind>.jsonl`` of an older nbtrain: valid up to its first unparsable line."""
        data = path.read_bytes()
        ends = _line_ends(data)
        begin = 0
        for index, end in enumerate(ends.tolist()):
            if not _parses(data[begin:end]):
                ends = ends[:index]
                break
            begin = end + 1
        size = int(ends[-1]) + 1 if len(ends) else 0
        if not self.read_only:  # taken up as the first segment, never read again as a legacy file
            with open(path, "r+b") as handle:
                handle.truncate(size)
                os.fsync(handle.fileno())
            private_dir(self.dir)
            target = self._segment_path(0)
            os.replace(path, target)
            fsync_dir(self.dir)
            path = target
        self._ends = array("q", ends.tolist())
        return _Segment(0, path, size, len(ends))

    def _open_last(self) -> None:
        last = self._segments[-1]
        self._fd = private_opener(str(last.path), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        if os.fstat(self._fd).st_size != last.size:  # a torn tail: cut it before anything follows it
            os.ftruncate(self._fd, last.size)
            os.fsync(self._fd)
        if last.count == 0:
            fsync_dir(self.dir)

    # ------------------------------------------------------------------ writing
    def __len__(self) -> int:
        with self._lock:
            return self._written() + len(self._pending)

    def _written(self) -> int:
        last = self._segments[-1] if self._segments else None
        return last.first + last.count if last else 0

    def append(self, records: list[dict[str, Any]]) -> None:
        """Add ``records`` at the end: written now, or kept pending if writing fails (see :attr:`failure`)."""
        if not records:
            return
        if self.read_only:
            msg = f"{self.dir} was opened read-only; it cannot be appended to."
            raise PermissionError(msg)
        lines = [_encoded(record) for record in records]
        with self._lock:
            self._pending.extend(lines)
            self._pending_records.extend(records)
            self._write_pending()

    def flush_pending(self) -> bool:
        """Write the records kept in memory after a failed write; True when none are left."""
        with self._lock:
            if self._pending and not self.read_only:
                self._write_pending()
            return not self._pending

    @property
    def pending(self) -> int:
        """Records kept in memory, not yet written."""
        return len(self._pending)

    def _write_pending(self) -> None:
        if self._fd is None:  # closed (the run's files are being deleted): nothing more is written
            return
        while self._pending:
            last = self._segments[-1]
            room = self._segment_rows - last.count
            if room <= 0:
                try:
                    self._seal()
                except OSError as exc:
                    self.failure = exc
                    return
                continue
            lines = self._pending[:room]
            data = b"".join(lines)
            try:
                _check_fault()
                assert self._fd is not None
                view = memoryview(data)
                while view:  # a short write is followed by one that fails with the reason
                    view = view[os.write(self._fd, view):]
            except OSError as exc:
                self.failure = exc
                try:  # nothing may follow a partly written line
                    assert self._fd is not None
                    os.ftruncate(self._fd, last.size)
                except OSError:
                    pass
                return
            for line in lines:
                last.size += len(line)
                self._ends.append(last.size - 1)
            last.count += len(lines)
            del self._pending[:len(lines)]
            del self._pending_records[:len(lines)]
            self.failure = None

    def _seal(self) -> None:
        """The last segment is full: fsync it and start the next."""
        last = self._segments[-1]
        assert self._fd is not None
        _check_fault()
        os.fsync(self._fd)
        first = last.first + last.count
        nxt = _Segment(first, self._segment_path(first), 0, 0)
        fd = private_opener(str(nxt.path), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC)
        os.close(self._fd)
        self._fd = fd
        fsync_dir(self.dir)
        self._indexes[last.path] = np.frombuffer(self._ends, dtype=np.int64).copy()
        self._trim_cache()
        self._ends = array("q")
        self._segments.append(nxt)

    def sync(self) -> bool:
        """Write pending records and fsync the segment being filled; True when nothing is pending."""
        with self._lock:
            if self.read_only or self._fd is None:
                return True
            self._write_pending()
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self.failure = exc
                return False
            return not self._pending

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # ------------------------------------------------------------------ reading
    def read(self, start: int, stop: int | None = None) -> list[dict[str, Any]]:
        """Records ``[start, stop)`` (pending ones included), parsed."""
        records: list[dict[str, Any]] = []
        for piece in self.read_pieces(start, stop):
            if isinstance(piece, bytes):
                records.extend(parse_lines(piece))
            else:
                records.extend(piece)
        return records

    def read_pieces(self, start: int, stop: int | None = None) -> Iterator[bytes | list[dict[str, Any]]]:
        """Records ``[start, stop)`` as they are kept: the JSON lines of each segment (bytes), then
        the pending records (a list), in order. For readers that parse lines faster than one by one."""
        with self._lock:
            written = self._written()
            total = written + len(self._pending)
            stop = total if stop is None else min(stop, total)
            start = max(start, 0)
            spans = []
            for segment in self._segments:
                lo, hi = max(start, segment.first), min(stop, segment.first + segment.count)
                if lo < hi:
                    ends = self._line_index(segment)
                    begin = int(ends[lo - segment.first - 1]) + 1 if lo > segment.first else 0
                    spans.append((segment.path, begin, int(ends[hi - segment.first - 1]) + 1))
            pending = self._pending_records[max(start - written, 0):max(stop - written, 0)]
        for path, begin, end in spans:
            with open(path, "rb") as handle:
                handle.seek(begin)
                yield handle.read(end - begin)
        if pending:
            yield list(pending)

    def _line_index(self, segment: _Segment) -> Any:
        if segment is self._segments[-1]:
            return self._ends
        index = self._indexes.get(segment.path)
        if index is None:
            with open(segment.path, "rb") as handle:
                index = _line_ends(handle.read(segment.size))
            self._indexes[segment.path] = index
            self._trim_cache()
        self._indexes.move_to_end(segment.path)
        return index

    def _trim_cache(self) -> None:
        while len(self._indexes) > CACHED_INDEXES:
            self._indexes.popitem(last=False)


def last_written(directory: Path, kind: str) -> tuple[str, int, float] | None:
    """What changes whenever the log of ``kind`` in run ``directory`` gets a record: its last segment's
    name, size and modification time; ``None`` when it has none. Nothing is read or created."""
    folder = directory / kind
    try:
        segments = [path for path in folder.glob("*.jsonl") if path.stem.isdigit()] if folder.is_dir() else []
        last = max(segments) if segments else directory / f"{kind}.jsonl"  # an older nbtrain's single file
        info = last.stat()
    except OSError:
        return None
    return last.name, info.st_size, info.st_mtime


_FINITE_ENCODER = json.JSONEncoder(allow_nan=False, default=str)


def _encoded(record: dict[str, Any]) -> bytes:
    """``record``'s JSON line, as :func:`nbtrain._json.dumps` writes it (twice as fast when all floats are finite)."""
    try:
        text = _FINITE_ENCODER.encode(record)
    except ValueError:  # NaN or an infinity: written as strings
        text = _json.dumps(record)
    return (text + "\n").encode()


def parse_lines(data: bytes) -> list[dict[str, Any]]:
    """The records of whole JSON lines, parsed as one JSON array (about twice as fast as line by line)."""
    joined = b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]"
    if b'"NaN"' in data or b'Infinity"' in data:  # non-finite floats, written as strings (see _json)
        records: list[dict[str, Any]] = _json.loads(joined)
    else:
        records = json.loads(joined)
    return records


def _line_ends(data: bytes) -> np.ndarray[Any, Any]:
    """Offsets of every newline in ``data`` (int64)."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == NEWLINE).astype(np.int64)


def _valid_line_ends(data: bytes) -> np.ndarray[Any, Any]:
    """The newlines of ``data``'s whole lines, without a torn tail: the bytes after the last
    newline, and last lines that do not parse (a crash of the machine can leave zeros there)."""
    ends = _line_ends(data)
    while len(ends):
        begin = int(ends[-2]) + 1 if len(ends) > 1 else 0
        if _parses(data[begin:int(ends[-1])]):
            break
        ends = ends[:-1]
    return ends


def _parses(line: bytes) -> bool:
    try:
        return isinstance(_json.loads(line), dict)
    except ValueError:
        return False


def _check_fault() -> None:
    flag = os.environ.get(FAULT_DISK_FULL_ENV)
    if flag and os.path.exists(flag):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + f" (simulated: {FAULT_DISK_FULL_ENV})")
