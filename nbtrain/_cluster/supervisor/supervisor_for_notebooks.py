"""The supervisor's face to notebooks (and sweeps, the CLI, the lab's sidebar): reads of the run (its summary,
the cursor feed, its config, result and checkpoints), the notebook's commands and their answers, and the
user's stop, resume, drain, fork and delete."""

from __future__ import annotations

from typing import Any

import cloudpickle
import ray

from nbtrain._cluster.commands import Command
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import post_mortems
from nbtrain._cluster.storage.run_storage import checkpoint_for_fork
from nbtrain._cluster.supervisor.controller_parts import failure_policy_for, sizing_for
from nbtrain._cluster.supervisor.stored_run import delete_files
from nbtrain._cluster.supervisor.supervisor_base import READERS, Found, SupervisorBase
from nbtrain._exceptions import NbtrainError
from nbtrain._states import RunState


class ForNotebooks(SupervisorBase):
    """The methods notebooks call (over Ray, by these names); the long polls wait in the readers' threads."""

    def steer(self, kind: str, args: dict[str, Any], definition: bytes | None = None) -> tuple[bool, Any]:
        """A command from the notebook: (True, the command with its step) or (False, why it was refused);
        ``definition``: its kind, when not nbtrain's own (``command_kinds.table.register``)."""
        with self._feed.lock:
            state = self._run.state
            running = self._table.steering_now()
        if state.is_terminal:
            return False, f"it has ended ({state.value}); only a live run can be steered."
        try:
            return True, self._run.steering.issue(kind, args, running, live=state == RunState.RUNNING,
                                                  attempt=self._run.attempt, definition=definition)
        except ValueError as refused:
            return False, str(refused)

    @ray.method(concurrency_group=READERS)
    def command_results(self, command_id: int, ranks: list[int], wait_s: float) -> dict[int, tuple[bool, Any]]:
        return self._run.steering.results(command_id, ranks, wait_s)

    @ray.method(concurrency_group=READERS)
    def command_applied_yet(self, command_id: int, wait_s: float) -> Command:
        """The command once rank 0 applied it (waiting up to ``wait_s``), else as it stands."""
        return self._run.steering.when_applied(command_id, wait_s)

    def fork_source(self, step: int | None) -> tuple[bytes, tuple[dict[str, Any], bytes] | str]:
        """``run.fork()``: the launch's spec, and the checkpoint to start from (or why there is none)."""
        with self._feed.lock:
            checkpoint = self._run.checkpoint
        return cloudpickle.dumps(self._run.spec), checkpoint_for_fork(checkpoint, step)

    def latest_checkpoint(self) -> Found | None:
        with self._feed.lock:
            checkpoint = self._run.checkpoint
        return self._read_checkpoint(checkpoint)

    def post_mortem(self, attempt: int, rank: int) -> bytes | None:
        return post_mortems.read(self._storage.dir, attempt, rank)

    def drain(self, node_id: str, deadline_s: float) -> tuple[bool, str]:
        """``run.drain(node)``: the node is about to go; the run checkpoints and goes on without it.
        (done, what was done or why not): the notebook raises the refusal as its own error."""
        try:
            return True, self._run.drain(node_id, deadline_s)
        except NbtrainError as refused:
            return False, str(refused)

    @ray.method(concurrency_group=READERS)
    def poll(self, cursor: int = 0, log_cursor: int = 0, event_cursor: int = 0,
             max_rows: int = 50_000, wait_s: float = 0.0) -> dict[str, Any]:
        """Everything new since the caller's cursors, plus the run's summary.

        With ``wait_s`` the call is a long poll: it returns as soon as something new
        arrives (or ``wait_s`` passes), so a dashboard gets rows one flush after they
        were reported without calling in a tight loop.
        """
        with self._feed.lock:
            answer = self._feed.read((cursor, log_cursor, event_cursor), max_rows, wait_s,
                                     lambda: self._run.state.is_terminal, self._table.running_ranks,
                                     self._run.spec.options.flush_interval_s)
            return {**answer, **self._summary_locked()}

    def summary(self) -> dict[str, Any]:
        with self._feed.lock:
            return self._summary_locked()

    def config(self) -> bytes:
        """The run's whole config, cloudpickled (summaries carry only ``config_summary``: they are sent on
        every poll). Bytes, as a stored run answers, since the config may hold values only the notebook can load."""
        return cloudpickle.dumps(self._run.spec.options.config)  # type: ignore[no-any-return]

    def frame_ipc(self, start: int = 0, stop: int | None = None) -> bytes:
        """Metric rows ``[start, stop)`` as an Arrow IPC stream (``run.metrics_frame()``)."""
        return self._feed.frame_ipc(start, stop)

    def result(self) -> list[bytes] | None:
        return self._run.results

    def stop(self, timeout: float = 20.0) -> str:
        """Stop the run; returns when its workers are gone and their resources freed."""
        return self._run.request_stop(timeout).value

    def resume(self, spec_bytes: bytes, datasets: dict[str, Any] | None = None) -> str:
        """Start an ended run again as a new attempt from its latest checkpoint (``launch(resume=True)``).

        Returns ``"resumed"``, or what prevented it: the state of a run still going, ``"deleted"``, or
        ``"retired"`` (this supervisor is exiting: the caller resumes the run from its files instead).
        """
        with self._feed.lock:
            if self._deleted:
                return "deleted"
            if self._retired:
                return "retired"
        spec: RunSpec = cloudpickle.loads(spec_bytes)
        sizing = sizing_for(spec, self._say) if spec.options != self._run.spec.options else None
        return self._run.resume(spec, datasets, failure_policy_for(spec), sizing)

    def delete(self) -> str:
        """Remove the ended run's files: history, checkpoints and state (``storage=`` included).

        Returns ``"deleted"``, or the state of a run still going (nothing is removed then), or
        ``"retired"`` once this supervisor is exiting and leaving the run to its files (its
        answer might never arrive: the caller deletes through the files instead).
        The caller kills this actor next, so nothing writes the files again.
        """
        with self._final_files, self._feed.lock:  # a retirement writing the final files finishes them first
            if self._retired:
                return "retired"
            if not self._run.state.is_terminal:
                return self._run.state.value
            self._deleted = True
            self._storage.close()
            delete_files(self._run.spec.name, self._storage.dir)
        return "deleted"
