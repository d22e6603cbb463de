"""Profiling a few steps on demand: ``run.profile(steps=20, ranks=[0])`` on the chosen ranks.

The rank's steering (see :mod:`.rank_steering`) starts :class:`StepProfile` after an optimizer update (or at a
report, for loops that give nbtrain no optimizer) and counts one step at each following one; after
``steps`` it stops torch.profiler and, on a thread of its own (the training goes on), answers with the
top operators by self time and the Chrome trace, gzipped, which the run's supervisor keeps in the run's
directory on the head (whichever node the rank is on, as rank 0's checkpoints are) and answers the
notebook its path instead.

Nothing of this is on the step while no profile runs: the profile lives in the steering's list of
pending commands, which the step hooks test anyway.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from nbtrain._cluster.commands import Command

MAX_TRACE_BYTES = 50 * 1024 * 1024  # gzipped; a bigger trace is not kept (the table still comes)
TOP_OPERATORS = 15


class StepProfile:
    """One profile in progress on this rank (made on the training thread, which starts and stops it)."""

    def __init__(self, command: Command, device: Any) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        self.command_id = command.id
        self.steps = command.steps
        self.done = 0
        self.on_gpu = getattr(device, "type", "cpu") == "cuda" and torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
        self._profiler = profile(activities=activities, record_shapes=False)
        self._profiler.start()
        self._began = time.perf_counter()
        self._took = 0.0

    def step(self) -> bool:
        """One more step profiled; True once all of them are."""
        self._profiler.step()
        self.done += 1
        return self.done >= self.steps

    def finish(self, session: Any, note: str = "", wait: bool = False) -> None:
        """Stop, then hand the trace and the table over (on a thread of its own unless ``wait``)."""
        self._took = time.perf_counter() - self._began
        self._profiler.stop()
        if wait:
            self._send(session, note)
        else:
            threading.Thread(target=self._send, args=(session, note), name="nbtrain-profile", daemon=True).start()

    def _send(self, session: Any, note: str) -> None:
        rank = session.context.rank
        value: Any
        try:
            table = top_operators(self._profiler, self.on_gpu)
            step_ms = 1e3 * self._took / self.done if self.done else None
            data = _trace_bytes(self._profiler)
            answer: dict[str, Any] = {"table": table, "steps": self.done, "step_ms": step_ms, "note": note,
                                      "device": "cuda" if self.on_gpu else "cpu", "trace": None,
                                      "trace_bytes": len(data)}
            if len(data) > MAX_TRACE_BYTES:
                answer["note"] = (note + "; " if note else "") + (
                    f"its trace ({len(data) / 2**20:.0f} MB gzipped) is over {MAX_TRACE_BYTES // 2**20} MB and was "
                    "not kept: profile fewer steps")
            else:
                answer["trace"] = data  # the supervisor keeps it and answers its path (see RunController)
            ok, value = True, answer
        except Exception as exc:  # noqa: BLE001 - the notebook gets why; training goes on
            ok, value = False, f"Rank {rank}: the profile failed: {type(exc).__name__}: {exc}"
        session.supervisor.command_result.remote(self.command_id, rank, ok, value)


def top_operators(profiler: Any, on_gpu: bool) -> list[dict[str, Any]]:
    """The operators with the most self time (CPU, or the GPU's when profiled there), as rows."""
    operators = list(profiler.key_averages())
    total_cpu = sum(event.self_cpu_time_total for event in operators) or 1.0
    total_gpu = sum(_self_device(event) for event in operators) or 1.0
    key = _self_device if on_gpu else (lambda event: event.self_cpu_time_total)
    rows = []
    for event in sorted(operators, key=key, reverse=True)[:TOP_OPERATORS]:
        row = {"name": event.key, "calls": int(event.count), "self_cpu_us": float(event.self_cpu_time_total),
               "self_cpu_pct": 100.0 * event.self_cpu_time_total / total_cpu,
               "cpu_total_us": float(event.cpu_time_total)}
        if on_gpu:
            row["self_gpu_us"] = _self_device(event)
            row["self_gpu_pct"] = 100.0 * row["self_gpu_us"] / total_gpu
        rows.append(row)
    return rows


def _self_device(event: Any) -> float:
    return float(getattr(event, "self_device_time_total", 0.0) or getattr(event, "self_cuda_time_total", 0.0) or 0.0)


def _trace_bytes(profiler: Any) -> bytes:
    """The Chrome trace (what TensorBoard's profiler plugin and Perfetto open), gzipped."""
    handle, path = tempfile.mkstemp(suffix=".pt.trace.json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        packed = io.BytesIO()
        with open(path, "rb") as trace, gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=6) as out:
            shutil.copyfileobj(trace, out)
        return packed.getvalue()
    finally:
        os.unlink(path)
