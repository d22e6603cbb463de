"""A run's durable record on the supervisor's node: metrics, logs, events, checkpoints.

The supervisor appends every row as it arrives (JSON lines, flushed per batch),
so if its process dies Ray restarts it and :meth:`RunStorage.load` gives back
everything recorded; the notebook's cursor then continues where it was. The
run's directory is 0700 and its files 0600 (metrics and checkpoints are the
user's alone; see :mod:`nbtrain._paths`).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from nbtrain import _json
from nbtrain._exceptions import NbtrainError
from nbtrain._paths import private_dir, private_opener, read_json, write_json_atomic

KEEP_CHECKPOINTS = 2


def checkpoint_path(directory: str | Path, attempt: int, step: int) -> Path:
    """Where a checkpoint of ``attempt`` at ``step`` is written, in the supervisor's storage or ``storage=``."""
    return Path(directory) / f"checkpoint-a{attempt}-s{step}.pt"


def load_trusted(source: bytes | str, map_location: Any, weights_only: bool) -> Any:
    """``torch.load`` of checkpoint bytes or a path, explaining the weights-only refusal in words."""
    import pickle

    import torch

    try:
        return torch.load(io.BytesIO(source) if isinstance(source, bytes) else source,
                          map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        msg = ("The checkpoint holds objects other than tensors and plain containers, so it was not loaded "
               "(weights_only=True protects against code in untrusted pickles). Save state_dicts instead, or, "
               f"if you trust this checkpoint, load it with weights_only=False. Detail: {str(exc).splitlines()[0]}")
        raise NbtrainError(msg) from None


class RunStorage:
    def __init__(self, root: str | Path, run_name: str) -> None:
        self.dir = private_dir(Path(root) / run_name)
        private_dir(self.dir / "checkpoints")
        # open for the supervisor's lifetime: one flushed write per push, no reopen
        self._files = {kind: open(self.dir / f"{kind}.jsonl", "a", encoding="utf-8",  # noqa: SIM115
                                  opener=private_opener)
                       for kind in ("metrics", "logs", "events")}

    def append(self, kind: str, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        handle = self._files[kind]
        handle.write("".join(_json.dumps(record) + "\n" for record in records))
        handle.flush()

    def load(self, kind: str) -> list[dict[str, Any]]:
        path = self.dir / f"{kind}.jsonl"
        records = []
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    records.append(_json.loads(line))
                except ValueError:
                    break  # a line cut short by the crash: everything before it is intact
        return records

    def save_state(self, state: dict[str, Any]) -> None:
        write_json_atomic(self.dir / "state.json", state)

    def load_state(self) -> dict[str, Any] | None:
        return read_json(self.dir / "state.json")

    def write_checkpoint(self, meta: dict[str, Any], data: bytes) -> str:
        path = checkpoint_path(self.dir / "checkpoints", meta["attempt"], meta["step"])
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb", opener=private_opener) as handle:
            handle.write(data)
        os.replace(tmp, path)
        kept = sorted((self.dir / "checkpoints").glob("checkpoint-*.pt"), key=os.path.getmtime)
        for old in kept[:-KEEP_CHECKPOINTS]:
            if old != path:
                old.unlink(missing_ok=True)
        return str(path)

    def close(self) -> None:
        """Close the history files (before the run's directory is deleted); safe to call twice."""
        for handle in self._files.values():
            handle.close()
