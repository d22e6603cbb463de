"""RunSupervisor: the detached actor that owns one run, and the face it shows to workers and notebooks.

The notebook only submits a :class:`~nbtrain._cluster.spec.RunSpec` and
reads; everything else lives here, so closing the browser, restarting the
kernel or losing the Ray Client connection leaves the run going. One
supervisor per run, named ``nbtrain-run:<name>`` in the ``nbtrain`` namespace,
pinned to the head node, with ``max_restarts=-1``: if its process dies Ray
restarts it, it reloads its history from storage and restarts the workers from
the latest checkpoint.

A finished run holds no process: once the run has ended and its history is
durable, the supervisor writes what readers need (summary, result, config) and
exits; :mod:`~nbtrain._cluster.run.stored_run` answers for the run from then on.

The actor itself is thin. Its parts, one job each:

* :class:`~nbtrain._cluster.feed.feed.RunFeed` — the history and the cursor feed (``push`` in, ``poll`` out);
* :class:`~nbtrain._cluster.run.worker_table.WorkerTable` — each rank's state for the worker table;
* :class:`~nbtrain._cluster.run.controller.RunController` — the state machine and the control thread,
  which uses :class:`~nbtrain._cluster.run.worker_group.WorkerGroup` and :mod:`~nbtrain._cluster.run.failure_policy`.

It is a *threaded* actor: ``push`` (from workers) and ``poll`` (from notebooks)
run concurrently with the control thread. One lock guards the shared state; no
method blocks on workers while holding it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import ray

from nbtrain._cluster.commands import Command, Heartbeat
from nbtrain._cluster.feed.feed import RunFeed
from nbtrain._cluster.feed.push_relay import Push
from nbtrain._cluster.names import NAMESPACE, actor_name
from nbtrain._cluster.priority import lower_own_priority
from nbtrain._cluster.run import run_directory
from nbtrain._cluster.run.controller import RunController
from nbtrain._cluster.run.controller_parts import callbacks_for, failure_policy_for, sizing_for
from nbtrain._cluster.run.stored_run import delete_files, record_in_index, write_final
from nbtrain._cluster.run.worker_table import WorkerTable
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import post_mortems, storage_uri
from nbtrain._cluster.storage.run_storage import checkpoint_for_fork, kept_checkpoint, prune_checkpoints
from nbtrain._cluster.warm.spare_process import prestart_for_this_job
from nbtrain._exceptions import NbtrainError, StorageError
from nbtrain._ray_compat import on_head_node, worker_setup_hook_env
from nbtrain._states import RunState

# A supervisor that finds its run already ended (Ray restarted it, or launch(resume=True) brought it
# back for a resume) waits this long for the resume before it exits again.
RESUME_GRACE_S = 30.0
DISK_RETRY_S = 2.0  # a history that cannot be written (disk full) is retried this often before exiting
Found = tuple[dict[str, Any], bytes | None, str | None]  # a checkpoint: its meta, and its bytes or its path


READERS = "readers"  # the concurrency group of notebook-facing long polls
READER_THREADS = 16
RANKS = "ranks"  # the concurrency group of the standing questions for commands: one thread each while it
# waits, one per rank, or one per node where the node's relay asks for its ranks (feed/node_question)
RANK_THREADS = 256

SPEC_PART_BYTES = 64 * 1024  # each part of a spec given to a supervisor stays inline in Ray's creation task


def spec_parts(spec_bytes: bytes) -> tuple[bytes, ...]:
    """``spec_bytes`` cut into the supervisor's constructor arguments, each small enough for Ray to keep inline in
    the actor's creation task. An argument Ray moves to the object store instead (one of 100 KB or more)
    belongs to the notebook that created the supervisor: once that notebook is gone, a restarted supervisor
    could not read it, and Ray says so in the notebook's cell ("constructor arguments in the object store",
    ray-project/ray#53727). Ray keeps up to 10 MB of a task's arguments inline."""
    return tuple(spec_bytes[at:at + SPEC_PART_BYTES] for at in range(0, len(spec_bytes), SPEC_PART_BYTES)) or (b"",)


def files_where(spec: RunSpec, run_dir: Path) -> dict[str, Any] | None:
    """Where the ranks work (``run.files()``): the launching folder and the run's directory, from which each
    node chooses (see ``run_folder``); None where a ``runtime_env`` ``working_dir`` is their folder."""
    if "working_dir" in (spec.options.runtime_env or {}):
        return None
    launch = spec.launch_folder
    return {"launch": launch.path if launch else None, "launch_host": launch.host if launch else None,
            "run_dir": str(run_dir)}


def supervisor_actor() -> Any:
    """RunSupervisor as a Ray actor class (start it with :func:`supervisor_options`). The notebooks'
    long polls wait in threads of their own: however many dashboards follow the run, the ranks'
    pushes (and stop, checkpoints) keep the default group's threads. Ray takes concurrency groups
    only here, not in ``.options()``."""
    return ray.remote(concurrency_groups={READERS: READER_THREADS, RANKS: RANK_THREADS})(RunSupervisor)


def supervisor_options(run_name: str, holds: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ray actor options of a run's supervisor (the kernel starts it with these).

    Its runtime env marks its processes as supervisors' own: Ray gives the spare process kept
    for the next supervisor (see spare_process) to a supervisor only, never to a task; the
    spare imports this module as it starts. ``holds``: the run's uploaded folders
    (:func:`~nbtrain._packing.runtime_env.packages_to_hold`), kept on the cluster as long as the supervisor lives.
    """
    return {
        "name": actor_name(run_name), "namespace": NAMESPACE, "lifetime": "detached", "max_restarts": -1,
        "max_task_retries": 0, "max_concurrency": 64, "num_cpus": 0,
        "resources": on_head_node(),
        "runtime_env": {"env_vars": {"NBTRAIN_PROCESS": "run supervisor",
                                     **worker_setup_hook_env(f"{__name__}.{_imported.__name__}")}, **(holds or {})},
    }


def _imported() -> None:
    """A spare supervisor process's setup hook (see spare_process): Ray imports this module to call it,
    and importing it is the whole point."""


class RunSupervisor:
    def __init__(self, *spec_parts: bytes, datasets: dict[str, Any] | None = None) -> None:
        """``spec_parts``: the run's pickled spec as :func:`spec_parts` cut it."""
        spec_bytes = b"".join(spec_parts)
        lower_own_priority()  # the ranks' cores come first; see priority
        spec: RunSpec = cloudpickle.loads(spec_bytes)
        if spec.warm_pool:  # this process is taken: Ray starts one for the next launch's supervisor to take
            threading.Thread(target=prestart_for_this_job, args=(spec.options.warm_idle_s,),
                             name="nbtrain-spare", daemon=True).start()
        lock = threading.RLock()
        run_directory.refuse_a_name_taken(spec)
        set_aside = run_directory.set_aside_earlier_run(spec)
        storage = run_directory.open_storage(spec)
        storage.save_spec(spec_bytes)
        remote = storage_uri.remote_storage(spec.options.storage)
        record_in_index(spec.name, storage.dir, spec.launch_id, remote and storage_uri.join(remote, spec.name))
        self._storage = storage
        self._files_where = files_where(spec, storage.dir)
        self._deleted = False
        self._retired = False
        self._handle = ray.get_runtime_context().current_actor
        self._feed = RunFeed(storage, lock)
        self._table = WorkerTable(lock)
        self._run = RunController(spec, datasets, self._feed, storage, self._table, self._handle, on_end=self._retire,
                                  failure_policy=failure_policy_for(spec), sizing=sizing_for(spec, self._say),
                                  callbacks=callbacks_for(spec, storage.dir))
        # held while the run's final files are written (outside the feed's lock: a full disk waits there), so that
        # delete() never removes them just before they are written again
        self._final_files = threading.Lock()
        if set_aside is not None:
            self._feed.event("storage", f"{storage.dir} held the files of an earlier run named {spec.name!r} "
                                        f"that is no longer on the cluster; they were moved to {set_aside}.", 0)
        self._run.recover()
        if spec.initial_checkpoint is not None and self._run.checkpoint is None:
            self._start_from(*spec.initial_checkpoint)
        if self._run.state.is_terminal:
            threading.Timer(RESUME_GRACE_S, self._retire).start()
        else:
            self._run.start()

    def _start_from(self, meta: dict[str, Any], data: bytes) -> None:
        """Keep a given checkpoint as the run's latest, before any rank starts (PBT's copy from another trial)."""
        path = self._storage.write_checkpoint(meta, data)
        with self._feed.lock:
            self._run.checkpoint = {**meta, "path": path}
            self._run.persist()
        origin = f" of run {meta['from_run']}" if meta.get("from_run") else ""
        self._feed.event("checkpoint", f"starting from the checkpoint{origin} at step {meta['step']}", 0)

    def _retire(self) -> None:
        """Leave the ended run to its files and exit: a finished run holds no process.

        Called by the control thread when the run ends (and after the resume grace of a
        supervisor that found its run ended). Returns without exiting if the run was
        resumed or deleted meanwhile.
        """
        with self._final_files:
            with self._feed.lock:
                if not self._may_retire():
                    return
                summary = self._summary_locked()
                results = self._run.results
                config = cloudpickle.dumps(self._run.spec.options.config)
            write_final(self._storage.dir, summary, results, config)
            while not self._storage.sync():  # rows kept in memory while the disk was full: write them first
                time.sleep(DISK_RETRY_S)
        with self._feed.lock:  # a resume or delete may have come while the files were written
            if not self._may_retire():
                return
            self._retired = True
        ray.kill(self._handle, no_restart=True)

    def _say(self, kind: str, message: str) -> None:
        """An event of the run's current attempt (the sizing policy's)."""
        self._feed.event(kind, message, self._run.attempt)

    def _may_retire(self) -> bool:
        return self._run.state.is_terminal and not self._deleted and not self._retired

    # ------------------------------------------------------------------ worker-facing
    def push(self, rank: int, attempt: int, seq: int, rows: list[dict[str, Any]],
             beat: Heartbeat, logs: list[tuple[str, float, str]]) -> None:
        """Rows, heartbeat and log text from one rank; called fire-and-forget by its flusher."""
        nan_rows = self._feed.accept(rank, attempt, seq, rows, logs)
        if nan_rows is None:  # a push seen before
            return
        self._table.beat(rank, attempt, beat)
        self._run.report_batch(rows, nan_rows)

    def push_many(self, pushes: list[Push]) -> None:
        """The pushes of one node's ranks on one tick, from its :mod:`~nbtrain._cluster.feed.push_relay`."""
        for push in pushes:
            self.push(*push)

    def record_checkpoint(self, meta: dict[str, Any], data: bytes | None, path: str | None) -> None:
        """Rank 0's checkpoint: ``data`` to keep here, or the ``path`` (or pyarrow.fs URI) it wrote in ``storage=``."""
        resumed_from = (self._run.resume_from or {}).get("path")
        if data is not None:
            path = self._storage.write_checkpoint(meta, data, keep=resumed_from)
        with self._feed.lock:
            self._run.checkpoint = {**meta, "path": path}
            self._run.persist()
        self._feed.event("checkpoint", f"checkpoint saved at step {meta['step']} (attempt {meta['attempt']})",
                         self._run.attempt)
        if data is None and path is not None:
            try:
                prune_checkpoints(path, keep=resumed_from)
            except (OSError, StorageError) as exc:  # the new checkpoint is recorded: only old ones stay behind
                self._feed.event("storage", f"older checkpoints could not be deleted: {exc}", self._run.attempt)

    def keep_post_mortem(self, attempt: int, rank: int, data: bytes) -> None:
        """A failing rank's post-mortem for ``%ray_debug``, kept in the run's storage (before its failure is known)."""
        post_mortems.write(self._storage.dir, attempt, rank, data)

    def post_mortem(self, attempt: int, rank: int) -> bytes | None:
        return post_mortems.read(self._storage.dir, attempt, rank)

    def drain(self, node_id: str, deadline_s: float) -> tuple[bool, str]:
        """``run.drain(node)``: the node is about to go; the run checkpoints and goes on without it.
        (done, what was done or why not): the notebook raises the refusal as its own error."""
        try:
            return True, self._run.drain(node_id, deadline_s)
        except NbtrainError as refused:
            return False, str(refused)

    @ray.method(concurrency_group=RANKS)
    def control(self, attempt: int, seen: int, wait_s: float) -> tuple[bool, list[Command]]:
        """Each rank's standing question (see rank/rank_steering), or a node's relay's for its ranks: the notebook's
        commands after the ``seen``-th as soon as there are any (else after ``wait_s``), and whether a checkpoint
        is wanted (elastic)."""
        commands = self._run.steering.since(seen, wait_s)
        return self._run.checkpoint_wanted(attempt), commands

    def standing_questions(self) -> int:
        """How many questions for commands wait on this supervisor now (each holds one of its threads)."""
        return self._run.steering.questions

    def command_applied(self, command_id: int, rank: int, step: int, before: dict[str, Any] | None,
                        when: float) -> None:
        self._run.steering.applied(command_id, rank, step, before, when, self._run.world_size)

    def command_result(self, command_id: int, rank: int, ok: bool, value: Any) -> None:
        self._run.command_result(command_id, rank, ok, value)

    def guard_tripped(self, attempt: int, rank: int, branch: int, step: int, kind: str, message: str) -> None:
        """A rank's guard saw trouble (see guard_decisions): its action is issued to every rank, or the run stops."""
        self._run.guard_tripped(attempt, branch, step, kind, message)

    def checkpoint_at(self, step: int) -> Found | None:
        """The checkpoint kept at ``step`` (or the latest before it), for a rank's ``@on_rewind`` function."""
        with self._feed.lock:
            checkpoint = kept_checkpoint(self._run.checkpoint, step)
        return self._read_checkpoint(checkpoint)

    # ------------------------------------------------------------------ steering (the notebook's commands)
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

    def checkpoint_to_resume(self) -> Found | None:
        """The checkpoint the current attempt started from: what every rank's ``load_checkpoint()`` gets,
        however late in the attempt it asks. Not one rank 0 saved since: a rank slower to start would
        begin at another step than the others."""
        with self._feed.lock:
            checkpoint = self._run.resume_from
        return self._read_checkpoint(checkpoint)

    def _read_checkpoint(self, checkpoint: dict[str, Any] | None) -> Found | None:
        if checkpoint is None:
            return None
        path = checkpoint["path"]
        if self._run.spec.options.storage:
            return checkpoint, None, path
        with open(path, "rb") as handle:
            return checkpoint, handle.read(), None

    # ------------------------------------------------------------------ notebook-facing
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

    def _summary_locked(self) -> dict[str, Any]:
        run = self._run
        options = run.spec.options
        workers = self._table.snapshot()
        for worker in workers:
            worker["latest"] = dict(self._feed.latest_by_rank.get(worker["rank"], {}))
        return {
            "name": run.spec.name, "state": run.state.value, "attempt": run.attempt,
            "max_failures": options.max_failures, "workers": workers, "error": run.error,
            "failures": list(run.failures), "checkpoint": run.checkpoint, "started": run.started,
            "ended": run.ended, "now": time.time(), "config_summary": run.spec.config_summary,
            "modules": list(run.spec.modules), "parent": run.spec.parent,
            "world_size": run.world_size or options.max_workers,
            "workers_range": [options.min_workers, options.max_workers],
            "gpus_per_worker": options.gpus_per_worker, "cpus_per_worker": options.cpus_per_worker,
            "total_steps": options.total_steps, "total_epochs": options.total_epochs,
            "step": min([w.get("step", 0) for w in workers] or [0]), "owner": run.spec.owner,
            "latest": dict(self._feed.latest), "launch": run.spec.launch_id,
            **self._table.steering_summary(),
            "changes": run.steering.changes(),
            "guard": run.steering.guard(),
            "rewinds": sum(1 for command in run.steering.rewinds() if command.applied_step is not None),
            "files": self._files_where,
        }

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
