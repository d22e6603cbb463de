"""Where a run's files live on the head node, and the checks made before its supervisor opens them: a name
an ended run still holds is refused, and the files of an earlier run of the name are moved aside."""

from __future__ import annotations

import os
import time
from pathlib import Path

from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import RunStorage
from nbtrain._cluster.supervisor.stored_run import index_path
from nbtrain._exceptions import RunExistsError, StorageError
from nbtrain._paths import read_json, storage_root


def history_root(spec: RunSpec) -> Path:
    """Where the run's directory (history, state) is: ``storage=`` when it is a path, else nbtrain's home.

    A pyarrow.fs URI holds only checkpoints (see storage_uri): the history's fsynced,
    append-only segments stay on the head node's disk.
    """
    local = storage_uri.local_storage(spec.options.storage)
    return Path(local) if local else storage_root()


def open_storage(spec: RunSpec) -> RunStorage:
    """The run's storage, or a :class:`StorageError` naming the directory that cannot be written."""
    root = history_root(spec)
    try:
        return RunStorage(root, spec.name)
    except OSError as exc:
        where = ("storage (--storage)" if storage_uri.local_storage(spec.options.storage)
                 else "nbtrain's home on the head node ($NBTRAIN_HOME)")
        msg = (f"Run {spec.name!r} cannot keep its files in {Path(root) / spec.name}: "
               f"{exc.strerror or exc}. Give {where} a directory the cluster's head node can write.")
        raise StorageError(msg) from None


def refuse_a_name_taken(spec: RunSpec) -> None:
    """A new launch may not take the name of an ended run the cluster still keeps (``resume`` continues it).

    Checked here, on the head, rather than by the notebook before it asks for this actor:
    that would cost a task of its own, and a task a worker process, on every launch.
    """
    entry = read_json(index_path(spec.name))
    if isinstance(entry, dict) and entry.get("launch") != spec.launch_id and Path(str(entry.get("dir"))).exists():
        raise RunExistsError(f"A run named {spec.name!r} already exists on the cluster.")


def set_aside_earlier_run(spec: RunSpec) -> Path | None:
    """Move away the files of an earlier run of this name (not this launch's), so they are never taken up.

    A run that left the cluster without ``delete()`` (the cluster restarted, the actor was
    killed) leaves its files; a new launch of the name must start from step 0, not from them.
    Returns where they went.
    """
    directory = history_root(spec) / spec.name
    saved = read_json(directory / "state.json")
    if not isinstance(saved, dict) or saved.get("launch") == spec.launch_id:
        return None
    aside = directory.with_name(f"{spec.name}.earlier-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}")
    try:
        os.replace(directory, aside)
    except OSError as exc:
        msg = (f"Run {spec.name!r}: {directory} holds the files of an earlier run of that name and they "
               f"cannot be moved aside ({exc}). Delete or move that directory, or pick another name.")
        raise StorageError(msg) from None
    return aside
