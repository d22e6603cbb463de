"""What the notebook sends to the cluster to start a run: one picklable value.

The training function travels as cloudpickle bytes so the supervisor never has
to import the user's code (a notebook's ``__main__``); only workers unpickle it.
Ray Datasets travel beside the pickled spec, as an actor argument, so that Ray
Client maps their object references.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from nbtrain._options import RunOptions


@dataclasses.dataclass(frozen=True)
class RunSpec:
    options: RunOptions              # name always set
    fn_bytes: bytes
    fn_takes_config: bool
    owner: dict[str, Any] = dataclasses.field(default_factory=dict)  # notebook path, host, pid
    created: float = dataclasses.field(default_factory=time.time)

    @property
    def name(self) -> str:
        assert self.options.name is not None
        return self.options.name
