"""A run started over Ray Client loses nothing when the notebook's connection is gone (issue 45).

Ray Client's server keeps one "specific server" process per client session on the head, and ends a
session's non-detached work once its connection has been gone for the client's reconnect grace period
(``RAY_CLIENT_RECONNECT_GRACE_PERIOD``, 30 s unless set). The kernel here (a Python process kept alive, its
grace period set to ``GRACE_S``, so the gap need not sit through Ray's default) starts a 2-rank run over Ray
Client on a plain loopback cluster; the test then ends that session's server by its own PID, found among the
processes of the cluster it started, and keeps the kernel away for ``GAP_S``, three grace periods. The kernel
connects again: the run went on (its supervisor is detached: the cluster's, not the session's), ``attach``
shows it running, and the handle the kernel held from before the drop (what its dashboard reads) resumes
from its cursor with every row of both ranks, none lost, none twice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import _plain_cluster
import psutil
import pytest

pytestmark = pytest.mark.timeout(480)

AFTER_GAP_STEPS = 30  # the ranks stop this many steps past the furthest one the kernel sees once back
GRACE_S = 5  # how long the kernel's Ray Client tries to reconnect before it gives the session up
GAP_S = 3 * GRACE_S  # how long the kernel stays away: its session is over well before it comes back

KERNEL = r'''
import json, os, sys, time
import nbtrain
from nbtrain._exceptions import NotConnectedError

ADDRESS, TOKEN, LAST_STEP_FILE = sys.argv[1], sys.argv[2], sys.argv[3]
AFTER, GAP_S = int(sys.argv[4]), int(sys.argv[5])
nbtrain.connect(ADDRESS, token=TOKEN, progress=lambda _m: None)

def steps(config):
    """0.1 s a step until the step the kernel writes once it is back: the run outlasts the gap on any machine,
    and both ranks end at the same step."""
    import os, time as _time
    step = 0
    while not (os.path.exists(config["last"]) and step >= int(open(config["last"]).read() or 0)):
        nbtrain.report(step=step, sent=_time.time())
        _time.sleep(0.1)
        step += 1

run = nbtrain.launch(steps, workers=2, name="dropped", config={"last": LAST_STEP_FILE})
while len(run.metrics) < 10:
    run.refresh(wait_s=1)
print("READY", len(run.metrics), flush=True)
sys.stdin.readline()  # the test ended this session's server and kept the kernel away for GAP_S
try:
    nbtrain.attach("dropped")
    print("STILL-CONNECTED?", flush=True)
except NotConnectedError as exc:
    print("LOST", str(exc).splitlines()[0], flush=True)
dropped_at = time.time()
began = time.monotonic()
nbtrain.connect(ADDRESS, progress=lambda _m: None)  # the token was kept for this address
reconnect_s = time.monotonic() - began
attached = nbtrain.attach("dropped")
state_after_gap = str(attached.state)
while run.refresh():  # the handle held from before the drop: every row so far
    pass
last_step = max(row["step"] for row in run.metrics) + AFTER
with open(LAST_STEP_FILE + ".part", "w") as part:
    part.write(str(last_step))
os.replace(LAST_STEP_FILE + ".part", LAST_STEP_FILE)
while not run.state.is_terminal:
    run.refresh(wait_s=1)
while run.refresh():  # the rest of the history, page by page
    pass
by_rank = {rank: [r["step"] for r in run.metrics if r["rank"] == rank] for rank in (0, 1)}
during_gap = sum(1 for r in run.metrics if dropped_at - GAP_S < r["sent"] < dropped_at)
print("RESULT " + json.dumps({"state_after_gap": state_after_gap, "final": str(run.state), "by_rank": by_rank,
                              "during_gap": during_gap, "reconnect_s": reconnect_s, "last_step": last_step}),
      flush=True)
'''


def _session_servers(cluster: _plain_cluster.PlainCluster) -> list[psutil.Process]:
    """Ray Client's per-session servers of this cluster (each names the cluster's GCS address)."""
    return [proc for proc in cluster.processes() if "specific-server" in " ".join(proc.cmdline())]


def _gone(process: psutil.Process, timeout: float) -> None:
    """Until ``process`` has exited: gone, or a zombie its parent (Ray's proxier, not this test) has yet to reap,
    which ``Process.wait`` would sit through (17 s here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"Ray Client's session server {process.pid} outlived SIGKILL by {timeout} s")


def test_a_run_goes_on_while_the_notebooks_session_is_over_and_nothing_is_lost(tmp_path):
    with _plain_cluster.running() as cluster:
        kernel = subprocess.Popen([sys.executable, "-c", KERNEL, cluster.client_address, cluster.token,
                                   str(tmp_path / "last-step"), str(AFTER_GAP_STEPS), str(GAP_S)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=cluster.driver_env(RAY_CLIENT_RECONNECT_GRACE_PERIOD=str(GRACE_S)))
        try:
            ready = kernel.stdout.readline()
            assert ready.startswith("READY"), ready + kernel.stderr.read()[-4000:]
            [server] = _session_servers(cluster)  # this kernel's session: the only one on this cluster
            server.send_signal(signal.SIGKILL)
            _gone(server, timeout=30)
            time.sleep(GAP_S)  # the outage itself: what the test is about, not a wait for something to happen
            kernel.stdin.write("go on\n")
            kernel.stdin.flush()
            out, err = kernel.communicate(timeout=300)
        finally:
            if kernel.poll() is None:
                kernel.kill()
        lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines() if " " in line}
        assert "RESULT" in lines, out[-3000:] + err[-6000:]
        assert "LOST" in lines, out[-3000:]  # the notebook really had no connection
        result = json.loads(lines["RESULT"])
        assert result["state_after_gap"] == "running"
        assert result["final"] == "succeeded"
        # 0.1 s a step: ~GAP_S * 10 rows a rank while the kernel was away; two thirds of that on a loaded machine
        assert result["during_gap"] >= 2 * GAP_S * 10 * 2 // 3, "the run did not go on while the notebook was away"
        for rank, steps in result["by_rank"].items():
            assert steps == list(range(result["last_step"])), (rank, len(steps))
