"""Blocking until a run ends: Ctrl-C stops the run the blocked call launched, and only stops waiting otherwise."""

from __future__ import annotations

import _thread
import signal
import threading

import pytest

import nbtrain

from _helpers import wait_for
from _train_fns import train_steps

FOREVER = {"steps": 100_000, "sleep": 0.05}


@pytest.fixture
def python_sigint_handler():
    """A kernel turns SIGINT into KeyboardInterrupt; a suite started in the background may have it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_once_reporting(name: str) -> None:
    def reporting() -> bool:
        try:
            return bool(nbtrain.attach(name).metrics)
        except nbtrain.RunNotFoundError:  # not launched yet
            return False

    def interrupt() -> None:
        try:
            wait_for(reporting, 120, interval=0.3, message=f"{name} to report")
        finally:  # interrupt in any case: a call left blocking would hide the reason
            _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()


def test_interrupting_a_blocking_launch_stops_the_run(cluster, capsys, python_sigint_handler):
    _interrupt_once_reporting("blocking-launch")
    with pytest.raises(KeyboardInterrupt):
        nbtrain.launch(train_steps, config=FOREVER, workers=2, name="blocking-launch", wait=True)
    assert "Interrupted: run 'blocking-launch' was stopped" in capsys.readouterr().out
    assert nbtrain.attach("blocking-launch").state == nbtrain.RunState.STOPPED


def test_interrupting_or_timing_out_a_wait_on_an_attached_run_leaves_it_running(cluster, capsys, python_sigint_handler):
    launched = nbtrain.launch(train_steps, config=FOREVER, workers=1, name="someone-elses")
    try:
        attached = nbtrain.attach("someone-elses")
        _interrupt_once_reporting("someone-elses")
        with pytest.raises(KeyboardInterrupt):
            attached.wait()
        assert "Stopped waiting; run 'someone-elses' keeps going" in capsys.readouterr().out
        assert attached.state == nbtrain.RunState.RUNNING
        with pytest.raises(TimeoutError, match=r"still running after 1 s; it keeps going"):
            attached.wait(timeout=1)
        assert attached.state == nbtrain.RunState.RUNNING
    finally:
        launched.stop()
    assert launched.state == nbtrain.RunState.STOPPED


def test_interrupting_the_panels_blocking_launch_stops_its_run(cluster, capsys, python_sigint_handler):
    panel = nbtrain.LaunchPanel(train_steps, config=FOREVER, workers=1, name="panel-blocking")
    panel.mode.value = "blocking"
    _interrupt_once_reporting("panel-blocking")
    with pytest.raises(KeyboardInterrupt):
        panel.launch()
    assert "Interrupted: run 'panel-blocking' was stopped" in capsys.readouterr().out
    assert nbtrain.attach("panel-blocking").state == nbtrain.RunState.STOPPED
