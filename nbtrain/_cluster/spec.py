"""What the notebook sends to the cluster to start a run: one picklable value.

The training function travels as cloudpickle bytes so the supervisor never has
to import the user's code (a notebook's ``__main__``); only workers unpickle it.
Ray Datasets travel beside the pickled spec, as an actor argument, so that Ray
Client maps their object references.
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
import time
import uuid
from typing import Any

from nbtrain._cluster.working_folder import LaunchFolder
from nbtrain._options import RunOptions

CONFIG_SUMMARY_CHARS = 300


@dataclasses.dataclass(frozen=True)
class RunSpec:
    options: RunOptions              # name always set
    fn_bytes: bytes
    fn_takes_config: bool
    modules: tuple[str, ...] = ()     # the notebook's own modules sent with the function (name@hash)
    notes: tuple[str, ...] = ()       # what launch() decided for the user; one event each when the run is created
    owner: dict[str, Any] = dataclasses.field(default_factory=dict)  # notebook path, host, pid
    # The launching process's folder: where the ranks work when they run on its machine (see working_folder).
    launch_folder: LaunchFolder | None = dataclasses.field(default_factory=LaunchFolder.here)
    created: float = dataclasses.field(default_factory=time.time)
    launch_called: float | None = None  # time.time() as the notebook's launch began (see launch_phases)
    # Which launch the run's stored files belong to: a supervisor takes up only its own launch's files.
    launch_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    # The launching notebook session's warm pool (its actor name), when the run may use warm workers.
    warm_pool: str | None = None
    # A placement group reserved for the run by someone else (a sweep's trial, reserved by Ray Tune): rank r
    # runs in its bundle r, and the run neither creates nor removes a group of its own.
    placement_group: Any = None
    # A checkpoint (meta, bytes) the run starts from, as if its ranks had saved it: a sweep's trial that
    # Population Based Training restarts from a better trial's checkpoint.
    initial_checkpoint: tuple[dict[str, Any], bytes] | None = None
    # run.fork(): the run this one was forked from and the step of the checkpoint it started at.
    parent: dict[str, Any] | None = None
    # run.fork(config=...)'s optimizer settings (lr, momentum, ...): applied to the optimizer the ranks restored
    # from the checkpoint before its first update, as a change of the run's history.
    settings_at_start: dict[str, Any] | None = None
    patches_at_start: tuple[str, ...] = ()  # a fork's: the parent's patches, applied from its first step boundary
    # The names of the run's ``datasets=``: the Ray Datasets travel beside the spec and are kept nowhere, so a
    # fork of the run is given them again (run.fork(datasets=...)), and is told which when it is not.
    dataset_names: tuple[str, ...] = ()
    # ``runtime_env`` as the launch was given it, its folders the notebook machine's paths (``options`` holds
    # their uploads, which Ray deletes once no live process names them): a fork uploads them again.
    runtime_env_given: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        assert self.options.name is not None
        return self.options.name

    @functools.cached_property
    def config_summary(self) -> str:
        """The config as one short line for headers and summaries; the full dict stays in ``options.config``."""
        return summarize_config(self.options.config or {})


def summarize_config(config: dict[str, Any], limit: int = CONFIG_SUMMARY_CHARS) -> str:
    """``lr=0.01, epochs=5, …`` in at most ``limit`` characters, however big the config or its values.

    The config is resent in every poll and drawn in the dashboard's header, where a
    megabyte of it would cost every refresh and fill the screen.
    """
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    short.maxlist = short.maxdict = short.maxtuple = short.maxset = 4
    parts: list[str] = []
    used = 0
    for key, value in config.items():
        part = f"{key}={short.repr(value)}"
        if parts and used + len(part) + 2 > limit - 16:  # room left for "… (N more)"
            parts.append(f"… ({len(config) - len(parts)} more)")
            break
        parts.append(part)
        used += len(part) + 2
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What the notebook sends to start a sweep: its options and the template of every trial's run
    (the spec each trial copies, with its own name, config and Ray Tune's placement group)."""

    options: Any                     # nbtrain._sweep_options.SweepOptions, name always set
    trial_run: RunSpec
    owner: dict[str, Any] = dataclasses.field(default_factory=dict)
    created: float = dataclasses.field(default_factory=time.time)

    @property
    def name(self) -> str:
        assert self.options.name is not None
        return str(self.options.name)
