"""Running a launch again: an ended run keeps its name, and the new run takes the next free ``NAME-N``.

A second *Run All* launches the tutorials' names again. A name held by an ended run (succeeded, failed or
stopped) starts a new run ``NAME-2``, ``NAME-3``… and says so in one line; the ended run is left as it was and
``attach(NAME)`` still means it. A live run's name is refused. A sweep's name works the same way. Two launches
racing for the same numbered name end with two names: the one that starts second chooses again.
"""

from __future__ import annotations

from typing import Any

import pytest
from ray import tune

import nbtrain
from nbtrain._client.launching import starting as launching
from nbtrain._cluster.names import find_supervisor

from _helpers import wait_for
from _train_fns import train_steps

QUICK = {"steps": 3, "sleep": 0.01, "checkpoint_every": 1}
FOREVER = {"steps": 10**6, "sleep": 0.02}


def test_launching_an_ended_runs_name_again_starts_name_2_and_leaves_the_old_run_as_it_was(
        cluster, capfd: pytest.CaptureFixture[str]):
    first = nbtrain.launch(train_steps, name="again", workers=1, config=QUICK, wait=True)
    rows, checkpoint = first.metrics, first.load_checkpoint()

    # at once, while the first run's supervisor may still be exiting, and again once it has
    second = nbtrain.launch(train_steps, name="again", workers=1, config={**QUICK, "steps": 4}, wait=True)
    assert second.name == "again-2" and second.state == nbtrain.RunState.SUCCEEDED
    assert "'again' is an ended run (kept); this run is 'again-2'. resume=True" in capfd.readouterr().err
    assert [row["step"] for row in second.metrics] == [0, 1, 2, 3]  # a new run, not the old one's continuation
    assert "'again' is an ended run (kept); this run is 'again-2'" in " ".join(e["message"] for e in second.events)
    wait_for(lambda: find_supervisor("again") is None and find_supervisor("again-2") is None, 60,
             message="both runs' supervisors to exit")
    third = nbtrain.launch(train_steps, name="again", workers=1, config=QUICK, wait=True)
    assert third.name == "again-3" and third.state == nbtrain.RunState.SUCCEEDED

    old = nbtrain.attach("again")
    assert old.state == nbtrain.RunState.SUCCEEDED and old.attempt == 1
    assert old.metrics == rows and old.config == QUICK and old.load_checkpoint()["step"] == checkpoint["step"] == 2
    assert {"again", "again-2", "again-3"} <= {run["name"] for run in nbtrain.runs()}

    # resume=True still continues the ended run itself
    resumed = nbtrain.launch(train_steps, name="again", workers=1, config={**QUICK, "steps": 5}, resume=True,
                             wait=True)
    assert resumed.name == "again" and resumed.attempt == 2
    assert [row["step"] for row in resumed.metrics if row["attempt"] == 2] == [3, 4]


def test_a_live_runs_name_is_refused_and_once_stopped_it_is_numbered(cluster):
    live = nbtrain.launch(train_steps, name="held", workers=1, config=FOREVER)
    wait_for(lambda: live.metrics, 60, message="the live run's first row")
    with pytest.raises(nbtrain.RunExistsError, match=r"Run 'held' is still going .*\(running\).*nbtrain.attach"):
        nbtrain.launch(train_steps, name="held", workers=1, config=QUICK)
    assert live.stop() == nbtrain.RunState.STOPPED
    after = nbtrain.launch(train_steps, name="held", workers=1, config=QUICK, wait=True)
    assert after.name == "held-2" and nbtrain.attach("held").state == nbtrain.RunState.STOPPED


def _hiding(real: Any, hidden: str) -> Any:
    """``real`` (a lister of names) as a launch racing another sees it once: without the names starting ``hidden``."""
    looks: list[int] = []

    def look() -> list[str]:
        looks.append(1)
        names: list[str] = real()
        return [name for name in names if not name.startswith(hidden)] if len(looks) == 1 else names
    return look


def test_a_numbered_name_another_launch_took_meanwhile_is_chosen_again(cluster, monkeypatch: pytest.MonkeyPatch):
    """Two launches of an ended run's name at once may both choose ``NAME-2``: the one that starts second finds
    it taken and chooses again. Played by hiding ``raced-*`` from the first look at the cluster's names: Ray
    refuses the actor's name while that run is live; the supervisor refuses it once the run has ended."""
    nbtrain.launch(train_steps, name="raced", workers=1, config=QUICK, wait=True)
    live = nbtrain.launch(train_steps, name="raced", workers=1, config=FOREVER)
    assert live.name == "raced-2"

    real_runs, real_stored = launching.run_names, launching.stored_names
    monkeypatch.setattr(launching, "run_names", _hiding(real_runs, "raced-"))
    monkeypatch.setattr(launching, "stored_names", _hiding(real_stored, "raced-"))
    beside_a_live_one = nbtrain.launch(train_steps, name="raced", workers=1, config=QUICK, wait=True)
    assert beside_a_live_one.name == "raced-3" and live.state == nbtrain.RunState.RUNNING

    live.stop()
    wait_for(lambda: not any(find_supervisor(name) for name in ("raced", "raced-2", "raced-3")), 60,
             message="the runs' supervisors to exit")
    monkeypatch.setattr(launching, "run_names", _hiding(real_runs, "raced-"))
    monkeypatch.setattr(launching, "stored_names", _hiding(real_stored, "raced-"))
    beside_ended_ones = nbtrain.launch(train_steps, name="raced", workers=1, config=QUICK, wait=True)
    assert beside_ended_ones.name == "raced-4" and beside_ended_ones.state == nbtrain.RunState.SUCCEEDED
    assert nbtrain.attach("raced-2").state == nbtrain.RunState.STOPPED


def reports(config):
    for step in range(1, 3):
        nbtrain.report(step=step, loss=config["q"] / step)


def test_a_sweep_under_an_ended_sweeps_name_is_name_2(cluster, capfd: pytest.CaptureFixture[str]):
    first = nbtrain.tune(reports, space={"q": tune.grid_search([1.0])}, metric="loss", mode="min",
                         workers_per_trial=1, name="swept", wait=True)
    second = nbtrain.tune(reports, space={"q": tune.grid_search([2.0])}, metric="loss", mode="min",
                          workers_per_trial=1, name="swept", wait=True)
    assert (first.name, second.name) == ("swept", "swept-2")
    assert "'swept' is an ended sweep (kept); this sweep is 'swept-2'" in capfd.readouterr().err
    assert second.state == "succeeded" and second.trials[0].run.name == "swept-2-t0"
    old = nbtrain.attach_sweep("swept")
    assert old.trials[0].config["q"] == 1.0 and old.trials[0].run.name == "swept-t0"

