"""RunSupervisor: the detached actor that owns one run, and its lifecycle.

The notebook only submits a :class:`~nbtrain._cluster.spec.RunSpec` and
reads; everything else lives here, so closing the browser, restarting the
kernel or losing the Ray Client connection leaves the run going. One
supervisor per run, named ``nbtrain-run:<name>`` in the ``nbtrain`` namespace,
pinned to the head node, with ``max_restarts=-1``: if its process dies Ray
restarts it, it reloads its history from storage and restarts the workers from
the latest checkpoint.

A finished run holds no process: once the run has ended and its history is
durable, the supervisor writes what readers need (summary, result, config) and
exits; :mod:`~nbtrain._cluster.supervisor.stored_run` answers for the run from then on.

The actor's methods are grouped by who calls them: :class:`~.supervisor_for_ranks.ForRanks` (the ranks and
their nodes' relays), :class:`~.supervisor_for_notebooks.ForNotebooks` (notebooks, sweeps, the CLI), and this
module, its own lifecycle (start, recover, retire). The actor itself is thin. Its parts, one job each:

* :class:`~nbtrain._cluster.supervisor.feed.RunFeed` — the history and the cursor feed (``push`` in, ``poll`` out);
* :class:`~nbtrain._cluster.supervisor.worker_table.WorkerTable` — each rank's state for the worker table;
* :class:`~nbtrain._cluster.supervisor.controller.RunController` — the state machine and the control thread,
  which uses :class:`~nbtrain._cluster.supervisor.worker_group.WorkerGroup`, and is handed its policies and
  callbacks by :mod:`~nbtrain._cluster.supervisor.controller_parts`.

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

from nbtrain._cluster.names import NAMESPACE, actor_name
from nbtrain._cluster.priority import lower_own_priority
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.supervisor import run_files
from nbtrain._cluster.supervisor.controller import RunController
from nbtrain._cluster.supervisor.controller_parts import callbacks_for, failure_policy_for, sizing_for
from nbtrain._cluster.supervisor.feed import RunFeed
from nbtrain._cluster.supervisor.stored_run import record_in_index, write_final
from nbtrain._cluster.supervisor.supervisor_base import RANK_THREADS, RANKS, READER_THREADS, READERS
from nbtrain._cluster.supervisor.supervisor_for_notebooks import ForNotebooks
from nbtrain._cluster.supervisor.supervisor_for_ranks import ForRanks
from nbtrain._cluster.supervisor.worker_table import WorkerTable
from nbtrain._cluster.warm.spare_process import supervisor_runtime_env
from nbtrain._ray_compat import on_head_node, ready_to_deserialize

# A supervisor that finds its run already ended (Ray restarted it, or launch(resume=True) brought it
# back for a resume) waits this long for the resume before it exits again.
RESUME_GRACE_S = 30.0
DISK_RETRY_S = 2.0  # a history that cannot be written (disk full) is retried this often before exiting

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
    node chooses (see ``working_folder``); None where a ``runtime_env`` ``working_dir`` is their folder."""
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
        "resources": on_head_node(), "runtime_env": supervisor_runtime_env(holds),
    }


def _imported() -> None:
    """A spare supervisor process's setup hook (see spare_process): Ray imports this module to call it (importing
    it is most of the point), and the process readies Ray's deserialization for the supervisor's arguments."""
    ready_to_deserialize()


class RunSupervisor(ForRanks, ForNotebooks):
    """The run's actor: its faces (:class:`ForRanks`, :class:`ForNotebooks`) and, here, its lifecycle."""

    def __init__(self, *spec_parts: bytes, datasets: dict[str, Any] | None = None) -> None:
        """``spec_parts``: the run's pickled spec as :func:`spec_parts` cut it."""
        spec_bytes = b"".join(spec_parts)
        lower_own_priority()  # the ranks' cores come first; see priority
        spec: RunSpec = cloudpickle.loads(spec_bytes)
        lock = threading.RLock()
        run_files.refuse_a_name_taken(spec)
        set_aside = run_files.set_aside_earlier_run(spec)
        storage = run_files.open_storage(spec)
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
        if spec.warm_pool:  # this process is taken: the pool has Ray start one for the next launch's supervisor
            threading.Thread(target=self._spare_after_first_step, name="nbtrain-spare", daemon=True).start()
        self._run.recover()
        if spec.initial_checkpoint is not None and self._run.checkpoint is None:
            self._start_from(*spec.initial_checkpoint)
        if self._run.state.is_terminal:
            threading.Timer(RESUME_GRACE_S, self._retire).start()
        else:
            self._run.start()

    def _spare_after_first_step(self) -> None:
        """Once the ranks are past their first step (starting a Python process is seconds of CPU, which on a
        small machine would come from this launch's ranks as they start), so that a relaunch right after the
        run finds the process up. A run that ends sooner gets one as its workers go back to the pool."""
        spec = self._run.spec
        self._run.phases.first_step.wait()
        try:
            pool = ray.get_actor(spec.warm_pool, namespace=NAMESPACE)
            pool.spare_for_next_supervisor.remote(spec.name, spec.options.warm_idle_s)
        except Exception:  # noqa: BLE001 - the session ended (its pool with it): no next launch to serve
            pass

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

    def _may_retire(self) -> bool:
        return self._run.state.is_terminal and not self._deleted and not self._retired
