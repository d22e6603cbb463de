"""A failing rank's post-mortem: its traceback with each frame's local variables, for ``%ray_debug``.

Taken where the rank handles the exception (:mod:`.worker`), from the user's first frame on;
nbtrain's own frames are left out. Per frame: file name, line, function, the line its code
starts at, its local variables, and the modules and values of the globals its code names; per
file, the source lines (from :mod:`linecache`, where notebook cells are, see
:mod:`nbtrain._packing.code_origin`), whole up to :data:`SOURCE_CHARS`, else a window around the lines
the frames need.

Values are pickled with cloudpickle within the run's ``debug_capture_mb`` (a rank's whole
capture; one value takes at most a quarter of it), the innermost frame's first: the debugger
opens there. Tensors travel as :class:`~nbtrain._cluster.rank.inspection.captured_values.TensorSummary`, also inside
containers and modules; a value that cannot be pickled or does not fit is kept as its ``repr``
(:class:`~nbtrain._cluster.rank.inspection.captured_values.CapturedRepr`, cut at :data:`REPR_CHARS`), saying why.

Capturing never blocks or fails the run: it runs on a thread of its own for at most
:data:`CAPTURE_TIME_S`; what it had not reached then is listed as not captured, and any error is
named in the capture instead of raised. The rank hands it to the supervisor, which keeps it in
the run's storage (:mod:`nbtrain._cluster.storage.post_mortems`).
"""

from __future__ import annotations

import io
import linecache
import os
import reprlib
import sys
import threading
import time
import types
from typing import Any

import cloudpickle

from nbtrain._cluster.rank.inspection.captured_values import CapturedRepr, TensorSummary
from nbtrain._packing.code_origin import code_names

CAPTURE_TIME_S = 5.0          # the whole capture, on its own thread
CAPTURE_THREAD = "nbtrain-post-mortem"
SEND_TIMEOUT_S = 10.0         # handing it to the supervisor
REPR_CHARS = 1000             # a value kept as its repr is cut here
SOURCE_CHARS = 500_000        # a file's lines travel whole up to this size; else a window around the frames' lines
SOURCE_WINDOW = 80            # lines before and after each frame's line (and from its function's first line)
SMALL_TENSOR = 20             # tensors of at most this many elements also keep their values' repr
EXCEPTION_BYTES = 64 * 1024   # the exception object itself, pickled, when it fits
NBTRAIN_DIR = os.path.dirname(os.path.abspath(str(sys.modules["nbtrain"].__file__))) + os.sep  # not user code

_short = reprlib.Repr()
_short.maxstring = _short.maxother = REPR_CHARS
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 20
_short.maxlevel = 3


def keep(exc: BaseException, tb: types.TracebackType | None, supervisor: Any, rank: int, attempt: int,
         cap_mb: float) -> bool:
    """Capture ``exc``'s post-mortem from ``tb`` on and hand it to the run's supervisor; never raises. Returns
    whether the capture ended (False: its thread still runs past :data:`CAPTURE_TIME_S`, and the process is not
    fit for another run: the warm pool does not take it back)."""
    if cap_mb <= 0:
        return True
    try:
        import ray

        data = capture(exc, tb, int(cap_mb * 2**20))
        ray.get(supervisor.keep_post_mortem.remote(attempt, rank, data), timeout=SEND_TIMEOUT_S)
    except Exception as problem:  # noqa: BLE001 - the run's failure is what matters; say why there is no capture
        print(f"nbtrain: this rank's post-mortem for %ray_debug could not be kept: {type(problem).__name__}: "
              f"{problem}", file=sys.stderr)
    return not any(thread.name == CAPTURE_THREAD for thread in threading.enumerate())


def capture(exc: BaseException, tb: types.TracebackType | None, cap_bytes: int,
            time_limit_s: float = CAPTURE_TIME_S) -> bytes:
    """The post-mortem of ``exc`` from ``tb`` on, pickled (a plain dict; see the module docstring)."""
    began = time.monotonic()
    frames = [entry for entry in _walk(tb) if not entry.tb_frame.f_code.co_filename.startswith(NBTRAIN_DIR)]
    work = _Capture(frames, cap_bytes)
    thread = threading.Thread(target=work.run, name=CAPTURE_THREAD, daemon=True)
    thread.start()
    thread.join(time_limit_s)
    took = time.monotonic() - began
    captured = work.result(finished=not thread.is_alive(), time_limit_s=time_limit_s)
    captured.update({
        "type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)[:2000],
        "exception": _pickled(exc, EXCEPTION_BYTES)[0], "took_s": took, "cap_bytes": cap_bytes,
    })
    return cloudpickle.dumps(captured)  # type: ignore[no-any-return]


def _walk(tb: types.TracebackType | None) -> list[types.TracebackType]:
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


class _Capture:
    """The capture's work, on its own thread; :meth:`result` takes whatever is done when called."""

    def __init__(self, entries: list[types.TracebackType], cap_bytes: int) -> None:
        self._entries = entries
        self._left = cap_bytes
        self._per_value = max(cap_bytes // 4, 1)
        self._lock = threading.Lock()
        self._stop = False
        self.frames: list[dict[str, Any]] = [{
            "filename": e.tb_frame.f_code.co_filename, "lineno": e.tb_lineno, "function": e.tb_frame.f_code.co_name,
            "firstlineno": e.tb_frame.f_code.co_firstlineno, "locals": {}, "globals": {},
        } for e in entries]
        self.sources: dict[str, list[str]] = {}
        self.skipped: list[str] = []
        self.done_frames: set[int] = set()

    def run(self) -> None:
        try:
            self._sources()
            for index in reversed(range(len(self._entries))):  # the innermost frame's values first
                self._frame_locals(index)
            for index in reversed(range(len(self._entries))):
                self._frame_globals(index)
        except Exception as problem:  # noqa: BLE001 - never raised to the run: named in the capture
            with self._lock:
                self.skipped.append(f"the capture stopped on {type(problem).__name__}: {problem}")

    def _sources(self) -> None:
        wanted: dict[str, list[tuple[int, int]]] = {}
        for frame in self.frames:
            wanted.setdefault(frame["filename"], []).append((frame["firstlineno"], frame["lineno"]))
        for filename, spans in wanted.items():
            lines = linecache.getlines(filename)
            if sum(map(len, lines)) > SOURCE_CHARS:  # a window around each frame; the rest blank lines
                keep: set[int] = set()
                for first, line in spans:
                    keep.update(range(max(first, line - SOURCE_WINDOW) - 1, line + SOURCE_WINDOW))
                lines = [text if index in keep else "\n" for index, text in enumerate(lines)]
            with self._lock:
                self.sources[filename] = list(lines)

    def _frame_locals(self, index: int) -> None:
        values = dict(self._entries[index].tb_frame.f_locals)
        for name, value in values.items():
            if self._stop:
                return
            self._add(index, "locals", name, self._value(value))
        with self._lock:
            self.done_frames.add(index)

    def _frame_globals(self, index: int) -> None:
        frame = self._entries[index].tb_frame
        if frame.f_globals is frame.f_locals:  # module-level code: its globals are its locals
            return
        for name in code_names(frame.f_code):
            if self._stop:
                return
            if name not in frame.f_globals or name in frame.f_locals:
                continue
            value = frame.f_globals[name]
            entry = {"module": value.__name__} if isinstance(value, types.ModuleType) else self._value(value)
            self._add(index, "globals", name, entry)

    def _add(self, index: int, kind: str, name: str, entry: dict[str, Any]) -> None:
        with self._lock:
            if not self._stop:
                self.frames[index][kind][name] = entry

    def _value(self, value: Any) -> dict[str, Any]:
        """``{"pickle": bytes}`` within the budget, else ``{"repr": CapturedRepr}``; both keep the repr."""
        text = _repr(value)
        limit = min(self._left, self._per_value)
        data, why = _pickled(value, limit) if limit > 0 else (None, "the capture's size cap was reached")
        kept = len(text) + (len(data) if data is not None else 0)
        with self._lock:
            self._left -= kept
        if data is not None:
            return {"pickle": data, "repr": text}
        return {"repr": CapturedRepr(text, type(value).__name__, why or "not picklable")}

    def result(self, finished: bool, time_limit_s: float) -> dict[str, Any]:
        with self._lock:
            self._stop = True
            skipped = list(self.skipped)
            if not finished:
                missing = [f"{f['function']} ({f['filename']}:{f['lineno']})" for i, f in enumerate(self.frames)
                           if i not in self.done_frames]
                skipped.append(f"the capture's time limit ({time_limit_s:g} s) passed before every value was "
                               f"kept; incomplete: {', '.join(missing) or 'the globals'}")
            return {"frames": [dict(f, locals=dict(f["locals"]), globals=dict(f["globals"])) for f in self.frames],
                    "sources": dict(self.sources), "skipped": skipped}


def _repr(value: Any) -> str:
    try:
        text = _short.repr(value) if not _is_tensor(value) else repr(_summary(value))
    except Exception as problem:  # noqa: BLE001 - a broken __repr__ is the user's; say so
        text = f"<{type(value).__name__}: repr failed with {type(problem).__name__}>"
    return text if len(text) <= REPR_CHARS else text[:REPR_CHARS - 1] + "…"


class _Full(Exception):
    pass


class _CappedBuffer(io.RawIOBase):
    """Where the pickler writes; stops it (raises) as soon as the value passes ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)  # bytes, or a PickleBuffer (an array's data, written as it is)
        self.size += view.nbytes
        if self.size > self.limit:
            raise _Full()
        self.parts.append(view.tobytes())
        return view.nbytes


class _SummarisingPickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle is untyped
    """cloudpickle, with every tensor (a model's parameters too) replaced by its summary."""

    def reducer_override(self, obj: Any) -> Any:
        if _is_tensor(obj):
            summary = _summary(obj)
            return TensorSummary, (summary.shape, summary.dtype, summary.device, summary.requires_grad,
                                   summary.stats, summary.values)
        return super().reducer_override(obj)


def _pickled(value: Any, limit: int) -> tuple[bytes | None, str | None]:
    """(the pickle, None) when ``value`` pickles within ``limit`` bytes, else (None, why not)."""
    buffer = _CappedBuffer(limit)
    try:
        _SummarisingPickler(buffer).dump(value)
    except _Full:
        return None, f"larger than the {limit / 2**20:.2g} MB it could take of debug_capture_mb"
    except Exception as problem:  # noqa: BLE001 - any value may refuse to pickle (or be nested too deep)
        return None, f"not picklable: {type(problem).__name__}: {str(problem)[:200]}"
    return b"".join(buffer.parts), None


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _summary(tensor: Any) -> TensorSummary:
    """Shape, dtype and device, and the values' min, max and mean (and the values of a small one). For a sharded
    tensor (a DTensor: FSDP2's parameters) those of this rank's shard: the whole's would be a collective, which a
    capture on its own thread must never start (one that ran on into the process's next run took part in that
    run's collectives and corrupted a restored checkpoint)."""
    stats: dict[str, float] = {}
    values = None
    try:
        to_local = getattr(tensor, "to_local", None)
        data = (to_local() if callable(to_local) else tensor).detach()
        if data.numel() and not data.is_complex() and data.dtype != _bool_dtype():
            stats = {"min": float(data.min()), "max": float(data.max()), "mean": float(data.double().mean())}
        if 0 < data.numel() <= SMALL_TENSOR:
            values = f"tensor({data.cpu().tolist() if data.ndim else data.cpu().item()!r})"
    except Exception:  # noqa: BLE001 - a meta, sparse or sharded tensor: shape and dtype only
        pass
    return TensorSummary(tuple(int(size) for size in tensor.shape), str(tensor.dtype).replace("torch.", ""),
                         str(tensor.device), bool(tensor.requires_grad), stats, values)


def _bool_dtype() -> Any:
    import torch

    return torch.bool
