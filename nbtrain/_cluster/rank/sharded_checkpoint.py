"""Sharded checkpoints: ``save_checkpoint(obj, sharded=True)`` with ``torch.distributed.checkpoint`` (DCP).

For models too big to gather on one rank: every rank writes its own shards, in
parallel, into one directory under ``storage=``, and rank 0 records it as the
run's latest checkpoint (format ``"dcp"``). In a directory every node reaches,
the ranks write there; at a pyarrow.fs URI (``s3://...``) each rank writes into
a local temporary directory and uploads its own files (DCP names them by rank),
and rank 0 records the checkpoint once every rank's upload is in.

On a worker, ``load_checkpoint(into=state)`` fills ``state`` (e.g.
``{"model": model.state_dict()}`` of the sharded model) in place, each rank
reading only its shards, at whatever world size. In the notebook,
``run.load_checkpoint()`` turns the directory into one full state dict
(``dcp_to_torch_save``), which loads into a plain model. A checkpoint at a URI is
copied to a local temporary directory to be read.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from nbtrain._cluster.storage import storage_uri
from nbtrain._cluster.storage.run_storage import storage_checkpoint
from nbtrain._exceptions import NbtrainError
from nbtrain._paths import private_dir


def save(obj: Any, storage: str | None, run_name: str, attempt: int, step: int) -> str:
    """Write this rank's shards of ``obj``; a collective (every rank calls it). Returns the directory."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if not storage:
        msg = ("save_checkpoint(sharded=True) writes each rank's shards into storage=, a directory every node "
               "reaches or a pyarrow.fs URI: launch with storage='/shared/checkpoints' or 's3://bucket/runs' "
               "(or save a gathered state dict: sharded=False).")
        raise NbtrainError(msg)
    path = storage_checkpoint(storage, run_name, attempt, step, "dcp")
    if not storage_uri.is_remote(path):
        private_dir(Path(path).parent)
        dcp.save(obj, checkpoint_id=path)
        return path
    with tempfile.TemporaryDirectory(prefix="nbtrain-dcp-") as local:
        dcp.save(obj, checkpoint_id=local)
        storage_uri.upload(local, path)
    if dist.is_initialized():
        dist.barrier()  # every rank's files are in before rank 0 records the checkpoint
    return path


def load_into(path: str, into: Any) -> Any:
    """Fill ``into`` (a state dict of the same structure, sharded or not) from the checkpoint at ``path``."""
    import torch.distributed.checkpoint as dcp

    if into is None:
        msg = ("The run's latest checkpoint is sharded (save_checkpoint(sharded=True)): give the state to fill, e.g. "
               "nbtrain.load_checkpoint(into={'model': model.state_dict()}), then model.load_state_dict(...).")
        raise NbtrainError(msg)
    with storage_uri.local_copy(path) as local:
        dcp.load(into, checkpoint_id=local)
    return into


def load_full(path: str, weights_only: bool) -> Any:
    """The whole checkpoint at ``path`` as one state dict of full tensors, without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with storage_uri.local_copy(path) as local, tempfile.TemporaryDirectory(prefix="nbtrain-dcp-") as directory:
        full = os.path.join(directory, "checkpoint.pt")
        dcp_to_torch_save(local, full)
        return torch.load(full, map_location="cpu", weights_only=weights_only)
