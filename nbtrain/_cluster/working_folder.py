"""Where a run's relative paths go: the folder a rank works in while the run's function runs.

The embedded cluster's processes live in a folder of nbtrain's own (a notebook's folder may be
renamed or deleted while the cluster runs), so a rank's working directory is chosen per run:
the folder of the process that launched the run (the notebook's) when the rank runs on that
machine and the folder is still there, so that ``open("data.csv")`` reads what the notebook
sees; else the run's own folder, ``<run directory>/files`` on the rank's node. A ``runtime_env``
with a ``working_dir`` keeps Ray's choice (the unpacked folder). A warm worker goes back to its
own folder after each run: the next run's ranks never start in the last run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
from pathlib import Path

from nbtrain._paths import private_dir

RUN_FILES = "files"  # in the run's directory: where its ranks work when the launching folder is not theirs


@dataclasses.dataclass(frozen=True)
class LaunchFolder:
    """The working directory of the process that launched a run, and its machine."""

    path: str | None  # None: that process's folder was deleted before it launched
    host: str

    @classmethod
    def here(cls) -> LaunchFolder:
        try:
            path: str | None = os.getcwd()
        except OSError:
            path = None
        return cls(path, socket.gethostname())


@dataclasses.dataclass(frozen=True)
class RankFolder:
    """What a rank needs to choose its working directory for one run (see the module docstring)."""

    launch: LaunchFolder | None
    run_dir: str  # the run's directory (on the supervisor's node; made on the rank's when missing)

    def choose(self) -> Path:
        launch = self.launch
        if launch is not None and launch.path and launch.host == socket.gethostname() and os.path.isdir(launch.path):
            return Path(launch.path)
        return Path(self.run_dir) / RUN_FILES


def enter(folder: RankFolder | None) -> str | None:
    """Work in ``folder``'s choice; returns the folder to go back to after the run (:func:`leave`).

    ``None`` (a ``runtime_env`` ``working_dir``): stay where Ray put the process. A folder that
    cannot be entered is said on the rank's log, and the rank stays where it is.
    """
    try:
        back: str | None = os.getcwd()
    except OSError:  # a process of a cluster started elsewhere, whose folder is gone: nothing to go back to
        back = None
    if folder is None:
        return back
    chosen = folder.choose()
    try:
        os.chdir(chosen if chosen.is_dir() else private_dir(chosen))
    except OSError as exc:
        print(f"nbtrain: this rank cannot work in {chosen} ({exc}); its relative paths resolve in {back}.",
              file=sys.stderr)
    return back


def leave(back: str | None) -> None:
    """After the run: back to the process's own folder, so that a warm worker's next run starts from it."""
    if back is not None:
        with contextlib.suppress(OSError):
            os.chdir(back)
