"""The files a run's ranks wrote where they worked, from the notebook: ``run.files()`` lists them, node by
node, and ``run.download()`` brings them here, from a remote cluster too.

Each node that ran ranks answers for its own folder in a short task pinned to it
(:mod:`nbtrain._cluster.storage.written_files` says which folder and which files); a download reads a file
in parts of ``PART_BYTES``, writes it under a temporary name and renames it whole, showing a progress
bar for a large one.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

from nbtrain._cluster.storage import written_files
from nbtrain._exceptions import InvalidOptionError, NbtrainError

ANSWER_S = 60.0               # one node's listing, or one part of a file
PROGRESS_FROM_BYTES = 16 * 1024 * 1024  # a download at least this big shows a progress bar


@dataclasses.dataclass(frozen=True)
class RunFile:
    """One file a run's ranks wrote: its path relative to their folder, its size, when it was last written,
    and the node and ranks whose folder holds it."""

    name: str
    size: int
    modified: float
    ranks: tuple[int, ...]
    node: str
    folder: str

    def __repr__(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.modified))
        return f"RunFile({self.name!r}, {_size(self.size)}, ranks {','.join(map(str, self.ranks))}, {when})"


def _nodes(summary: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """node_id -> (its label, the ranks it ran), from the run's worker table."""
    nodes: dict[str, tuple[str, list[int]]] = {}
    for worker in summary.get("workers") or []:
        if worker.get("node_id"):
            nodes.setdefault(worker["node_id"], (str(worker.get("node") or worker["node_id"][:8]), []))[1].append(
                int(worker["rank"]))
    return {node: (label, tuple(sorted(ranks))) for node, (label, ranks) in nodes.items()}


def _on_node(node_id: str, function: Any, *args: Any) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(function).options(num_cpus=0, max_retries=0,
                                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    return task.remote(*args)


def list_files(name: str, summary: dict[str, Any]) -> list[RunFile]:
    """What ``run.files()`` returns (see :meth:`nbtrain.Run.files`)."""
    import ray

    where = summary.get("files")
    if where is None:
        msg = (f"Run {name!r}'s ranks worked in its runtime_env's working_dir, a copy Ray made on each node: "
               "nbtrain does not keep track of what they wrote there. Write to an absolute path (or storage=) instead.")
        raise NbtrainError(msg)
    nodes = _nodes(summary)
    if not nodes:
        return []  # no rank has started yet
    until = summary.get("ended") if summary.get("state") in ("succeeded", "failed", "stopped") else None
    asked = {node: _on_node(node, written_files.list_written, where, summary.get("started"), until) for node in nodes}
    found: list[RunFile] = []
    for node, answer in asked.items():
        label, ranks = nodes[node]
        try:
            listing = ray.get(answer, timeout=ANSWER_S)
        except Exception as exc:  # noqa: BLE001 - a node gone: its files with it, said by name
            msg = (f"Node {label} (ranks {', '.join(map(str, ranks))}) of run {name!r} did not answer: "
                   f"{type(exc).__name__}. A node that left the cluster took the files its ranks wrote with it.")
            raise NbtrainError(msg) from None
        if listing["more"]:
            print(f"nbtrain: only the first {written_files.MAX_LISTED} files of {listing['folder']} on node "
                  f"{label} are listed.", file=sys.stderr)
        found += [RunFile(file_name, size, modified, ranks, label, listing["folder"])
                  for file_name, size, modified in listing["files"]]
    return sorted(found, key=lambda file: (file.name, file.ranks))


def chosen(name: str, listed: list[RunFile], name_or_pattern: str) -> list[tuple[str, RunFile]]:
    """The files of ``listed`` that ``name_or_pattern`` names (a name, or a glob such as ``"*.csv"``), with the
    relative path each lands at. A path that leads outside the run's folder is refused."""
    pure = PurePosixPath(name_or_pattern)
    if not name_or_pattern or pure.is_absolute() or ".." in pure.parts:
        msg = (f"download({name_or_pattern!r}): name a file of the run's folder by its relative path or a pattern "
               f"such as '*.csv' (run.files() lists them); absolute paths and '..' lead outside it.")
        raise InvalidOptionError(msg)
    matches = [file for file in listed if fnmatch.fnmatchcase(file.name, name_or_pattern)]
    if not matches:
        some = ", ".join(file.name for file in listed[:8]) or "none yet"
        msg = f"Run {name!r} has no file matching {name_or_pattern!r} in its folder (it has: {some})."
        raise NbtrainError(msg)
    by_name: dict[str, int] = {}
    for file in matches:
        by_name[file.name] = by_name.get(file.name, 0) + 1
    # the same name on several nodes (each node's ranks wrote their own): one copy each, named by node
    return [(file.name if by_name[file.name] == 1 else f"{file.node}/{file.name}", file) for file in matches]


def download(name: str, summary: dict[str, Any], files: list[tuple[str, RunFile]], to: str | os.PathLike[str],
             ) -> list[Path]:
    """Copy each of ``files`` under ``to``; what ``run.download()`` returns (see :meth:`nbtrain.Run.download`)."""
    import ray

    nodes = {label: node for node, (label, _ranks) in _nodes(summary).items()}
    target = Path(to)
    total = sum(file.size for _path, file in files)
    progress = _Progress(total, f"run {name!r}: {len(files)} file{'s' if len(files) != 1 else ''}")
    written = []
    try:
        for relative, file in files:
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            partial = destination.with_name(f".{destination.name}.nbtrain-partial")
            try:
                with partial.open("wb") as out:
                    offset = 0
                    while offset < file.size:
                        part = ray.get(_on_node(nodes[file.node], written_files.read_part, summary["files"],
                                                file.name, offset), timeout=ANSWER_S)
                        if not part:
                            break  # shorter than listed: it was cut since
                        out.write(part)
                        offset += len(part)
                        progress.advance(len(part))
                os.replace(partial, destination)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            written.append(destination)
    finally:
        progress.close()
    return written


class _Progress:
    """A bar for a download of ``PROGRESS_FROM_BYTES`` or more (tqdm's, in a notebook its widget); else nothing."""

    def __init__(self, total: int, description: str) -> None:
        self.bar: Any = None
        if total >= PROGRESS_FROM_BYTES:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=description)

    def advance(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"
