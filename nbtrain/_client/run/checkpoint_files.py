"""A run's checkpoint as files on the notebook's machine (``run.checkpoint_dir()``, Ray Train checkpoints)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from nbtrain._cluster.rank import sharded_checkpoint
from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import checkpoint_files, checkpoint_source, load_trusted
from nbtrain._paths import checkpoints_dir, private_dir


def load_in_notebook(run_name: str, meta: dict[str, Any], data: bytes | None, path: str | None, *,
                     weights_only: bool) -> Any:
    """A checkpoint as ``run.load_checkpoint()`` gives it: the saved object (a sharded one as one full state
    dict), or a Ray Train / Lightning checkpoint directory as a ``ray.train.Checkpoint``. One at a ``storage=``
    URI is read through pyarrow.fs from here: the notebook needs the store's credentials too."""
    form = meta.get("format", "torch")
    if form == "dcp":
        return sharded_checkpoint.load_full(str(path), weights_only)
    if form == "directory":
        from ray.train import Checkpoint

        return Checkpoint.from_directory(str(local_checkpoint_dir(run_name, meta, data, path)))
    return load_trusted(checkpoint_source(data, path, form), "cpu", weights_only)


def local_checkpoint_dir(run_name: str, meta: dict[str, Any], data: bytes | None, path: str | None) -> Path:
    """Where the checkpoint of ``meta`` lies on this machine: extracted once, then reused.

    ``data``: the checkpoint's bytes, from the supervisor; or ``path``, its file in ``storage=``.
    A directory checkpoint is its files; what ``nbtrain.save_checkpoint`` saved is ``checkpoint.pt``;
    a sharded one is its directory in a ``storage=`` directory (the notebook must reach it), or
    a copy of it from a ``storage=`` URI.
    """
    form = meta.get("format", "torch")
    if form == "dcp" and not storage_uri.is_remote(str(path)):  # already a directory, in storage=
        return Path(str(path))
    directory = checkpoints_dir() / run_name / f"a{meta['attempt']}-s{meta['step']}-{form}"
    if directory.is_dir():
        return directory
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=private_dir(directory.parent)))
    checkpoint_files(form, data, path, partial)
    os.replace(partial, directory)
    return directory
