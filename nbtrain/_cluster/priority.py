"""Training ranks first: lower the CPU priority of a run's bookkeeping processes.

On a laptop the ranks share a few cores with Ray's head processes, the Ray
Client servers and the run supervisor. DDP ranks run in lock step, so a rank
that waits for a core stalls every other rank at the next all-reduce: a few
percent of one core spent on bookkeeping cost several percent of throughput.
At a higher niceness that bookkeeping runs in the gaps the ranks leave (while
they wait in all-reduce) instead of taking turns with them; it still gets the
CPU it needs within milliseconds on a busy machine.

Only niceness can be raised by an unprivileged user, never lowered, so nothing
a rank inherits from may be touched: the raylet starts every worker process,
the ranks included, and keeps the priority it was started with.
"""

from __future__ import annotations

import os

import psutil

from nbtrain._ray_compat import driver_pid

BOOKKEEPING_NICENESS = 10

# Processes of the embedded cluster's head that do bookkeeping only. Not here: the
# raylet, whose niceness every worker inherits, and the Ray Client proxy, whose
# niceness a new session's server inherits: starting a session is seconds of CPU,
# which at niceness 10 beside two busy ranks would take minutes. Each session's
# server is lowered once it is up (lower_session_server_priority).
_HEAD_BOOKKEEPING_MARKERS = (
    "gcs_server", "DashboardAgent", "RuntimeEnvAgent",
    "dashboard/dashboard.py", "autoscaler/_private/monitor.py",
    "ray_head_process start",  # the head's own process (local_cluster.RAY_START)
)


def lower_priority(pid: int) -> None:
    """Raise every thread of process ``pid`` to ``BOOKKEEPING_NICENESS`` (never lowers one).

    On Linux niceness belongs to a thread, not a process, and a new thread or
    child process inherits it from the thread that starts it: renicing only the
    main thread would leave gRPC's threads, and the processes they fork, at full
    priority. Two passes catch a thread started during the first. A process that
    ends meanwhile is no error.
    """
    for _ in range(2):
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        except FileNotFoundError:  # the process ended, or there is no /proc (macOS: niceness is per process)
            threads = [] if os.path.isdir("/proc") else [pid]
        for tid in threads:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) < BOOKKEEPING_NICENESS:
                    os.setpriority(os.PRIO_PROCESS, tid, BOOKKEEPING_NICENESS)
            except OSError:
                continue


def lower_own_priority() -> None:
    """Raise this process, all its threads, to ``BOOKKEEPING_NICENESS``."""
    lower_priority(os.getpid())


def lower_head_bookkeeping_priority(head_pid: int) -> None:
    """Raise the bookkeeping processes under the ``ray start`` process ``head_pid``."""
    try:
        head = psutil.Process(head_pid)
        processes = [head, *head.children(recursive=True)]
    except psutil.Error:
        return
    for process in processes:
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:  # ended meanwhile
            continue
        if "raylet" not in command and any(marker in command for marker in _HEAD_BOOKKEEPING_MARKERS):
            lower_priority(process.pid)


def lower_session_server_priority() -> None:
    """From a worker of a Ray Client session: lower the priority of that session's server.

    A Ray Client session's server is the driver of the session's job, so the job
    table has its pid. Runs on the head node, so only meaningful where the head is
    this machine (the embedded cluster).
    """
    import ray

    pid = driver_pid(ray.get_runtime_context().get_job_id())  # None, said once, when Ray cannot tell
    if pid is not None:
        lower_priority(pid)
