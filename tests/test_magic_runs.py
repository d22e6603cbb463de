"""%%ray_train on the real loopback cluster, driven through IPython as a notebook would."""

from __future__ import annotations

import _thread
import signal
import threading
import time

import pytest
from IPython.core.error import UsageError

import nbtrain

from _helpers import ipython_shell, run_actor_names, wait_for


@pytest.fixture(scope="module")
def ip(cluster):
    shell = ipython_shell()
    result = shell.run_cell(f"%ray_connect {cluster.address}")
    assert result.error_in_exec is None
    return shell


NOTEBOOK_DEFINITIONS = '''
import torch
SCALE = 3.0
class Doubler(torch.nn.Module):
    def forward(self, x):
        return 2 * x
def helper(x):
    return x * SCALE
unused_big = list(range(100_000))
input = 3          # shadows a builtin: the ranks see this one
_offset = 0.5      # a _name is the user's too
'''


def test_notebook_function_class_and_constant_reach_the_workers(ip):
    assert ip.run_cell(NOTEBOOK_DEFINITIONS).error_in_exec is None
    result = ip.run_cell('''%%ray_train --workers 2 --name cell-capture --out run --config k=7
value = helper(Doubler()(torch.ones(1))).item()
nbtrain.report(value=value, k=config["k"])
result = (rank, world_size, value, config["k"], "unused_big" in globals(), input, _offset)
''')
    assert result.error_in_exec is None, result.error_in_exec
    run = ip.user_ns["run"]
    assert run.state == nbtrain.RunState.SUCCEEDED
    assert run.result == [(0, 2, 6.0, 7, False, 3, 0.5), (1, 2, 6.0, 7, False, 3, 0.5)]


def test_unpicklable_notebook_object_is_named(ip):
    ip.run_cell("import threading\nlock = threading.Lock()")
    result = ip.run_cell("%%ray_train --workers 2 --name uses-lock\nwith lock:\n    pass\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "`lock` (a threading.Lock) cannot be sent to the workers" in str(result.error_in_exec)
    assert not run_actor_names("uses-lock")


def test_failing_rank_fails_the_cell_with_its_traceback(ip, capsys):
    result = ip.run_cell('''%%ray_train --workers 2 --name cell-fails
for step in range(30):
    nbtrain.report(loss=1.0 / (step + 1))
    if rank == 1 and step == 5:
        raise ZeroDivisionError("rank one divided by zero")
''')
    error = result.error_in_exec
    assert type(error) is nbtrain.RunFailedError and "Run 'cell-fails' failed" in str(error)  # the public name
    assert "Rank 1 raised ZeroDivisionError at step 6: rank one divided by zero" in str(error)
    assert 'raise ZeroDivisionError("rank one divided by zero")' in str(error)  # the cell's own line
    # the rank's traceback starts at the cell's line, as a function's does: no nbtrain frame before it
    rank_traceback = str(error)[str(error).index("Traceback (most recent call last):"):]
    first_frame = rank_traceback.splitlines()[1]
    assert first_frame.lstrip().startswith("File \"Cell In[") or "<%%ray_train cell>" in first_frame, rank_traceback
    assert "nbtrain/" not in rank_traceback.split("ZeroDivisionError: rank one")[0], rank_traceback
    # what a terminal IPython prints (its one-line progress has no log pane): the error's name and message,
    # the rank's traceback included, none of nbtrain's frames
    printed = "\n".join(error._render_traceback_())
    assert printed.startswith("RunFailedError: Run 'cell-fails' failed."), printed
    assert 'raise ZeroDivisionError("rank one divided by zero")' in printed, printed
    assert not run_actor_names("cell-fails")


@pytest.fixture
def python_sigint_handler():
    """Python's own SIGINT handler for the test, as a kernel has it (the interrupt button is a SIGINT
    that becomes KeyboardInterrupt). A suite started in the background by a non-interactive shell
    (`./scripts/run-tests &`) inherits SIGINT ignored, Python keeps it so, and _thread.interrupt_main()
    would then do nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupting_a_blocking_cell_stops_the_run(ip, capsys, python_sigint_handler):
    problems = []  # why the helper thread could not see the run report, if it could not

    def interrupt_when_running():
        def running():
            try:
                return nbtrain.attach("interrupted").metrics
            except Exception as exc:  # noqa: BLE001 - kept for the assertion below
                problems.append(f"{type(exc).__name__}: {exc}")
                return False
        try:
            wait_for(running, 120, interval=0.3, message="the run to report")
            problems.clear()
        except AssertionError as exc:
            problems.append(str(exc))
        finally:  # interrupt in any case: a cell left blocking would hide the reason for minutes
            _thread.interrupt_main()

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    began = time.monotonic()
    result = ip.run_cell('''%%ray_train --workers 2 --name interrupted
import time
for step in range(100000):
    nbtrain.report(loss=1.0)
    time.sleep(0.05)
''')
    assert not problems, f"the run never showed metrics to a second reader: {problems[-3:]}"
    assert result.error_in_exec is None
    assert time.monotonic() - began < 150
    assert "Interrupted: run 'interrupted' was stopped" in capsys.readouterr().out
    assert nbtrain.attach("interrupted").state == nbtrain.RunState.STOPPED
    wait_for(lambda: not run_actor_names("interrupted"), 10, message="no actors left")


def test_background_run_returns_at_once_and_ray_stop_stops_it(ip, capsys):
    began = time.monotonic()
    result = ip.run_cell('''%%ray_train --workers 1 --bg --name in-background --out bg_run
import time
for step in range(100000):
    nbtrain.report(loss=1.0)
    time.sleep(0.05)
''')
    assert result.error_in_exec is None
    assert time.monotonic() - began < 10
    run = ip.user_ns["bg_run"]
    wait_for(lambda: run.metrics, 120, message="rows from the background run")
    ip.run_cell("%ray_status")
    assert "in-background" in capsys.readouterr().out
    ip.run_cell("%ray_stop in-background")
    assert "Run 'in-background' stopped." in capsys.readouterr().out
    assert run.state == nbtrain.RunState.STOPPED


def _dashboard_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"nbtrain-dashboard-{name}" and t.is_alive()]


def test_showing_a_dashboard_again_leaves_one_long_poll_and_the_feed_flowing(ip, capsys):
    """20 re-runs of a `run.dashboard()` cell during a run: one follower (one long poll) is left, rows still
    reach the notebook within a fraction of a second, and run.close() ends the last one."""
    from _train_fns import train_steps

    run = nbtrain.launch(train_steps, config={"steps": 2000, "sleep": 0.02}, workers=1, name="followed-again")
    ip.user_ns["followed"] = run
    for _ in range(20):
        assert ip.run_cell("view = followed.dashboard()").error_in_exec is None
    wait_for(lambda: len(_dashboard_threads("followed-again")) == 1, 10, message="one follower left",
             describe=lambda: len(_dashboard_threads("followed-again")))
    lags = []
    while len(lags) < 50:  # what a notebook waits for a row, with the other views gone
        arrived = run.refresh(wait_s=1.0)
        lags += [time.time() - row["time"] for row in arrived]
    lags.sort()
    assert lags[len(lags) // 2] < 0.5, f"feed p50 {lags[len(lags) // 2]:.2f} s"
    run.close()
    wait_for(lambda: not _dashboard_threads("followed-again"), 5, message="the last follower to end")
    run.stop()
