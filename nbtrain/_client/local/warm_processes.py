"""What the embedded cluster's warm processes cost: idle rank processes kept for the next run, and idle
processes kept for the next run's supervisor, with their memory (``nbtrain cluster status``).

Read from the processes under the head (the cluster is this machine's), without connecting: a status command
answers at once, and the cluster is asked nothing. Ray names a worker process after what it runs
(``ray::TrainWorker.run`` while a rank trains, ``ray::TrainWorker`` idle, ``ray::IDLE`` for a process that
runs nothing yet); a spare supervisor process is told apart by the environment supervisors get.
"""

from __future__ import annotations

import dataclasses

import psutil

from nbtrain._cluster.warm.spare_process import SPARE_TITLE, SUPERVISOR_PROCESS
from nbtrain._options import RunOptions

RANK_TITLE = "ray::TrainWorker"
SUPERVISOR_ENV = ("NBTRAIN_PROCESS", SUPERVISOR_PROCESS)  # what supervisors' processes have in their environment


@dataclasses.dataclass(frozen=True)
class WarmProcess:
    kind: str        # "rank" (an idle warm rank, or one warming) or "supervisor" (a spare for the next one)
    pid: int
    rss_bytes: int


def kind_of(title: str, environ: dict[str, str]) -> str | None:
    """Which warm process a worker process with this title and environment is, if any."""
    if title in (RANK_TITLE, f"{RANK_TITLE}.__init__", f"{RANK_TITLE}.tidy", f"{RANK_TITLE}.ping"):
        return "rank"
    if title == SPARE_TITLE and environ.get(SUPERVISOR_ENV[0]) == SUPERVISOR_ENV[1]:
        return "supervisor"
    return None


def warm_processes(head_pid: int) -> list[WarmProcess]:
    """The warm processes under the head process ``head_pid``; none when it cannot be read."""
    try:
        children = psutil.Process(head_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for process in children:
        try:
            title = " ".join(process.cmdline()).strip()
            kind = kind_of(title, process.environ()) if title.startswith("ray::") else None
            if kind is not None:
                found.append(WarmProcess(kind, process.pid, process.memory_info().rss))
        except psutil.Error:  # ended meanwhile, or not ours to read
            continue
    return found


def describe(processes: list[WarmProcess]) -> str:
    """One line: how many of each, and their memory."""
    ranks = [p for p in processes if p.kind == "rank"]
    spares = [p for p in processes if p.kind == "supervisor"]
    parts = [f"{len(ranks)} idle rank process{'es' * (len(ranks) != 1)} ({_size(ranks)})"]
    if spares:
        parts.append(f"{len(spares)} spare supervisor process{'es' * (len(spares) != 1)} ({_size(spares)})")
    idle_s = RunOptions().warm_idle_s
    return ("warm: " + ", ".join(parts) + f"; they exit after warm_idle_s ({idle_s:g} s unless a run or connect() "
            "set another), when their notebook's session ends, or at once with nbtrain.release_warm() in it")


def _size(processes: list[WarmProcess]) -> str:
    total = sum(p.rss_bytes for p in processes)
    return f"{total / 2**30:.1f} GB" if total >= 2**30 else f"{total / 2**20:.0f} MB"
