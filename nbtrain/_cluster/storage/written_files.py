"""What a run's ranks wrote where they worked, listed and read on each of their nodes (``run.files()``,
``run.download()``).

A rank works in the folder :mod:`nbtrain._cluster.working_folder` chose: the launching notebook's, when the
rank runs on its machine, else the run's own folder (``<run directory>/files``) on the rank's node. Each
function here runs in a short task on one such node. In the run's own folder every file is the run's;
in a notebook's folder, only those written while the run went (modified between its start and its end).
A name is a path relative to that folder: one that leads outside it is refused, whatever links it holds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nbtrain._cluster.working_folder import RUN_FILES, LaunchFolder, RankFolder

MAX_LISTED = 10_000          # files listed at most per node (a notebook's folder may hold a data set)
WRITE_SLACK_S = 2.0          # a file's time may trail the run's recorded end by a flush
PART_BYTES = 8 * 1024 * 1024  # one read of a download: a task's answer stays small


def rank_folder(where: dict[str, Any]) -> Path:
    """The folder the run's ranks on this node worked in, from the summary's ``files`` entry."""
    launch = LaunchFolder(where.get("launch"), str(where.get("launch_host") or ""))
    return RankFolder(launch, str(where["run_dir"])).choose()


def _is_own_folder(folder: Path, where: dict[str, Any]) -> bool:
    return folder == Path(str(where["run_dir"])) / RUN_FILES


def list_written(where: dict[str, Any], since: float | None, until: float | None) -> dict[str, Any]:
    """``{"folder", "own", "files": [[name, size, modified], ...], "more"}`` for this node: every file of the run's
    own folder, or a launching folder's files modified in ``[since, until]`` (``until`` None: the run goes on)."""
    folder = rank_folder(where)
    own = _is_own_folder(folder, where)
    found: list[list[Any]] = []
    more = False
    if folder.is_dir():
        for directory, subfolders, names in os.walk(folder):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            for name in sorted(names):
                path = Path(directory, name)
                try:
                    stat = path.stat()
                except OSError:
                    continue  # removed meanwhile, or a broken link
                if not own and not _written_during(stat.st_mtime, since, until):
                    continue
                if len(found) == MAX_LISTED:
                    more = True
                    break
                found.append([path.relative_to(folder).as_posix(), stat.st_size, stat.st_mtime])
            if more:
                break
    return {"folder": str(folder), "own": own, "files": found, "more": more}


def _written_during(modified: float, since: float | None, until: float | None) -> bool:
    return (since is None or modified >= since) and (until is None or modified <= until + WRITE_SLACK_S)


def inside(folder: Path, name: str) -> Path:
    """``folder / name``, refused (``ValueError``) when it leads outside ``folder`` (``..``, an absolute path,
    a link out)."""
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        msg = f"{name!r} is outside the run's folder ({folder})"
        raise ValueError(msg)
    return path


def read_part(where: dict[str, Any], name: str, offset: int, length: int = PART_BYTES) -> bytes:
    """``length`` bytes of the run's file ``name`` on this node from ``offset`` (fewer at its end)."""
    with inside(rank_folder(where), name).open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)
