"""Sharded checkpoints: ``save_checkpoint(obj, sharded=True)`` with ``torch.distributed.checkpoint`` (DCP).

For models too big to gather on one rank: every rank writes its own shards, in
parallel, into one directory under ``storage=`` (a file system every node
reaches), and rank 0 records it as the run's latest checkpoint (format
``"dcp"``). On a worker, ``load_checkpoint(into=state)`` fills ``state`` (e.g.
``{"model": model.state_dict()}`` of the sharded model) in place, each rank
reading only its shards, at whatever world size. In the notebook,
``run.load_checkpoint()`` turns the directory into one full state dict
(``dcp_to_torch_save``), which loads into a plain model.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from nbtrain._cluster.storage import checkpoint_path
from nbtrain._exceptions import NbtrainError
from nbtrain._paths import private_dir


def save(obj: Any, storage: str | None, run_name: str, attempt: int, step: int) -> str:
    """Write this rank's shards of ``obj``; a collective (every rank calls it). Returns the directory."""
    import torch.distributed.checkpoint as dcp

    if not storage:
        msg = ("save_checkpoint(sharded=True) writes each rank's shards into storage=, a directory every node "
               "reaches: launch with storage='/shared/checkpoints' (or save a gathered state dict: sharded=False).")
        raise NbtrainError(msg)
    path = checkpoint_path(os.path.join(storage, run_name, "checkpoints"), attempt, step, "dcp")
    private_dir(path.parent)
    dcp.save(obj, checkpoint_id=str(path))
    return str(path)


def load_into(path: str, into: Any) -> Any:
    """Fill ``into`` (a state dict of the same structure, sharded or not) from the checkpoint at ``path``."""
    import torch.distributed.checkpoint as dcp

    if into is None:
        msg = ("The run's latest checkpoint is sharded (save_checkpoint(sharded=True)): give the state to fill, e.g. "
               "nbtrain.load_checkpoint(into={'model': model.state_dict()}), then model.load_state_dict(...).")
        raise NbtrainError(msg)
    dcp.load(into, checkpoint_id=path)
    return into


def load_full(path: str, weights_only: bool) -> Any:
    """The whole checkpoint at ``path`` as one state dict of full tensors, without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="nbtrain-dcp-") as directory:
        full = os.path.join(directory, "checkpoint.pt")
        dcp_to_torch_save(path, full)
        return torch.load(full, map_location="cpu", weights_only=weights_only)
