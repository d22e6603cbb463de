"""The Jupyter server's side of ``nbtrain agent`` (see :mod:`nbtrain._client.agent`).

One child process, started on first use and again after it dies; commands
go to it one at a time (an ``asyncio.Lock``), so the IOLoop never blocks and
answers never interleave. A command that gets no answer within its timeout
kills the agent: a stuck Ray Client call must not wedge every later stop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from typing import Any

_STDERR_LINES = 20
_ANSWER_BYTES = 64 << 20  # one answer is one line: ``runs --json`` of a cluster with thousands of runs fits


class AgentProcess:
    def __init__(self, command: list[str], env: dict[str, str], cwd: str) -> None:
        self.command = command
        self.env = env
        self.cwd = cwd
        self.last_used = time.monotonic()
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._stderr_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def call(self, argv: list[str], timeout: float) -> tuple[bool, str]:
        """Run one ``nbtrain`` command in the agent; (it succeeded, its output)."""
        async with self._lock:
            self.last_used = time.monotonic()
            try:
                proc = await self._ensure_started()
            except OSError as error:
                return False, f"could not run {self.command[0]!r}: {error}"
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write((json.dumps(argv) + "\n").encode())
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), timeout=timeout)
            except asyncio.TimeoutError:
                await self.close()
                return False, f"nbtrain {' '.join(argv)} did not finish within {timeout:.0f} s"
            except (BrokenPipeError, ConnectionResetError):
                line = b""
            except ValueError:  # longer than _ANSWER_BYTES
                await self.close()
                return False, f"the nbtrain agent's answer to {argv[0]} was longer than {_ANSWER_BYTES} bytes"
            except asyncio.CancelledError:
                await self.close()  # the server is shutting down: leave no orphan behind
                raise
            self.last_used = time.monotonic()
            if not line:
                said = "\n".join(self._stderr) or "no message"
                await self.close()
                return False, f"the nbtrain agent exited unexpectedly: {said}"
            try:
                reply: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                await self.close()
                return False, f"the nbtrain agent answered something unexpected: {line[:200]!r}"
            return bool(reply.get("ok")), str(reply.get("output", ""))

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._stderr_task is not None:
            self._stderr_task.cancel()
            self._stderr_task = None

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        await self.close()
        self._stderr.clear()
        self._proc = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=self.cwd,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_ANSWER_BYTES,
        )
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(self._proc))
        return self._proc

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        """Keep the last lines of what the agent says on stderr (and never let its pipe fill)."""
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            self._stderr.append(line.decode(errors="replace").rstrip())

