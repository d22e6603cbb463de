"""The training ranks get the cores first; the cluster's and the run's bookkeeping yields to them."""

from __future__ import annotations

import time

import psutil

import nbtrain
from nbtrain._client.local import local_cluster
from nbtrain._cluster.priority import BOOKKEEPING_NICENESS

from _helpers import wait_for
from _reference_run import thread_niceness
from _train_fns import train_steps


def _head_processes() -> dict[str, list[psutil.Process]]:
    info = local_cluster.status()
    assert info is not None
    head = psutil.Process(info.pid)
    found: dict[str, list[psutil.Process]] = {}
    for process in [head, *head.children(recursive=True)]:
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:  # ended meanwhile (a run's workers)
            continue
        for role in ("gcs_server", "raylet/raylet", "--mode=proxy", "--mode=specific-server", "DashboardAgent",
                     "RunSupervisor"):
            if role in command:
                found.setdefault(role, []).append(process)
    return found


def test_ranks_keep_full_priority_while_the_bookkeeping_runs_nicer(cluster, reference_run):
    niceness = [measured["niceness"] for measured in reference_run.result]  # each rank's threads, read on the rank
    assert niceness == [0, 0], "the ranks must run at the priority the user's own processes have"

    # a finished run's supervisor has exited: look at one whose run goes on
    going = nbtrain.launch(train_steps, config={"steps": 10**6, "sleep": 0.05}, workers=1, name="priority-going")
    wait_for(lambda: going.metrics, 60, message="the second run's first row")
    processes = _head_processes()
    niceness = {role: sorted({min(found) for p in group if (found := thread_niceness(p.pid))})
                for role, group in processes.items()}
    print(f"niceness by role: {niceness}")
    for role in ("raylet/raylet", "--mode=proxy"):
        # workers inherit the raylet's niceness, a new Ray Client session's server the proxy's
        assert max(thread_niceness(processes[role][0].pid)) == 0, (role, niceness)
    # a kernel that joined as a driver has no session server on the head; over Ray Client it has one
    bookkeeping = ["gcs_server", "DashboardAgent", "RunSupervisor"]
    if cluster.via == "client":
        bookkeeping.append("--mode=specific-server")
    else:
        assert "--mode=specific-server" not in niceness, niceness
    for role in bookkeeping:
        assert niceness[role] and min(niceness[role]) >= BOOKKEEPING_NICENESS, (role, niceness)
    going.stop()


def test_one_long_poll_carries_every_rank_s_rows_of_a_flush(cluster):
    """Ranks flush on the same clock ticks and the supervisor gathers them, so a dashboard
    does not get rank 0 in one redraw and rank 1 a redraw later."""
    run = nbtrain.launch(train_steps, config={"steps": 80, "sleep": 0.05}, workers=2, name="one-poll")
    replies = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        began = time.monotonic()
        rows = run.refresh(wait_s=1.0)
        if rows and run.reader.summary["state"] == "running":
            replies.append({row["rank"] for row in rows})
        if nbtrain.RunState(run.reader.summary["state"]).is_terminal:
            break
        time.sleep(max(0.0, 0.25 - (time.monotonic() - began)))  # paced like the dashboard
    both = sum(ranks == {0, 1} for ranks in replies)
    print(f"{both} of {len(replies)} long polls carried both ranks' rows")
    assert len(replies) >= 5, replies
    assert both >= 0.6 * len(replies), replies
