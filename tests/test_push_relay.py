"""Wide runs push through one relay per node: every row still arrives once, in order, even if the relay dies;
and the node's ranks learn the notebook's commands from one question the relay holds on the supervisor.

Real loopback cluster; ``feed_relay="always"`` gives the 2-rank test run the relay a
wide run's nodes get (``auto`` starts them from 16 ranks).
"""

from __future__ import annotations

import collections
import pickle
import socket
from pathlib import Path

import pytest
import ray

import nbtrain
from nbtrain._cluster.names import NAMESPACE, find_supervisor
from nbtrain._cluster.relay.push_relay import wants_relays
from nbtrain._cluster.relay.relay_link import FRAME

from _helpers import wait_for

STEPS_EACH_HALF = 40


def report_around_a_gate(config):
    """Reports the first half of its steps, waits for the test's gate file, then reports the rest."""
    import os
    import time as t

    for step in range(1, config["half"] + 1):
        nbtrain.report(step=step, loss=1.0 / step)
    deadline = t.monotonic() + 120
    while not os.path.exists(config["gate"]):
        if t.monotonic() > deadline:
            raise TimeoutError(f"the test never opened {config['gate']}")
        t.sleep(0.02)
    for step in range(config["half"] + 1, 2 * config["half"] + 1):
        nbtrain.report(step=step, loss=1.0 / step)


def _relay_sockets() -> dict[str, int]:
    """Open Unix sockets per relay address, as Linux lists them: a listening socket and each connection it
    accepted, under the address (``@`` for an abstract one's leading NUL)."""
    with open("/proc/net/unix") as table:
        names = [line.split()[-1] for line in table.readlines()[1:] if line.split()[-1].startswith("@nbtrain-relay-")]
    return dict(collections.Counter(names))


def _relays(run_name: str) -> list[str]:
    return [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == NAMESPACE and actor["name"].startswith(f"nbtrain-relay:{run_name}:")]


@pytest.mark.quick
def test_auto_gives_relays_to_wide_runs_only():
    assert not wants_relays("auto", world_size=8, ranks_on_node=8)
    assert wants_relays("auto", world_size=256, ranks_on_node=8)
    assert not wants_relays("auto", world_size=256, ranks_on_node=1)  # a node of one rank gains nothing
    assert wants_relays("always", world_size=2, ranks_on_node=1)
    assert not wants_relays("never", world_size=256, ranks_on_node=8)


def test_rows_arrive_once_in_order_through_the_relay_and_after_it_dies(cluster, tmp_path: Path):
    gate = tmp_path / "gate"
    name = "relay-killed"
    run = nbtrain.launch(report_around_a_gate, workers=2, name=name, feed_relay="always",
                         config={"half": STEPS_EACH_HALF, "gate": str(gate)})

    def first_halves_in() -> bool:
        run.refresh(wait_s=0.5)
        return len(run.reader.rows_since(0)) >= 2 * STEPS_EACH_HALF

    wait_for(first_halves_in, timeout=90, message="both ranks' first rows, through the relay",
             describe=lambda: (run.state, len(run.reader.rows_since(0))))
    relays = _relays(name)
    assert len(relays) == 1, relays  # both ranks on the one loopback node: one relay
    relay = ray.get_actor(relays[0], namespace=NAMESPACE)
    address, _ = ray.get(relay.socket_address.remote())
    # it listens, and each rank pushes over a connection of its own (no Ray call per push)
    assert _relay_sockets().get("@" + address[1:]) == 3, _relay_sockets()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:  # without the relay's secret: shut out
        stranger.settimeout(30)
        stranger.connect(address)
        empty = pickle.dumps(())  # a well-formed push frame: a relay that took it would answer FAILED
        stranger.sendall(b"x" * 32 + FRAME.pack(len(empty)) + empty)
        assert stranger.recv(1) == b"", "a connection without the secret must be closed unanswered"
    ray.kill(relay, no_restart=True)
    wait_for(lambda: not _relays(name), timeout=30, message="the killed relay to be gone")
    gate.touch()

    run.wait(timeout=120)
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error
    for rank in (0, 1):
        steps = [row["step"] for row in run.metrics if row["rank"] == rank]
        assert steps == list(range(1, 2 * STEPS_EACH_HALF + 1)), (rank, steps)


def test_a_small_run_starts_no_relay(cluster, tmp_path: Path):
    gate = tmp_path / "gate"
    name = "relay-none"
    run = nbtrain.launch(report_around_a_gate, workers=2, name=name, config={"half": 5, "gate": str(gate)})
    wait_for(lambda: len(_fresh(run).reader.rows_since(0)) >= 10, timeout=90,
             message="both ranks' first rows")
    assert _relays(name) == []  # its ranks are up and waiting at the gate: no relay beside them
    gate.touch()
    run.wait(timeout=120)
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error


def steps_until_the_gate(config):
    """One SGD update and one report a step, 0.05 s a step, until the test's gate file is there."""
    import os
    import time as t

    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    while not os.path.exists(config["gate"]):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        nbtrain.report(lr=optimizer.param_groups[0]["lr"])
        t.sleep(0.05)


def _fresh(run):
    """``run`` once what is new has been fetched (a long poll of up to half a second)."""
    run.refresh(wait_s=0.5)
    return run


def _past(run, step: int) -> bool:
    """Whether both ranks reported a step after ``step``."""
    return all(any(row["rank"] == rank and row["step"] > step for row in _fresh(run).metrics) for rank in (0, 1))


def _lr_from(run, rank: int, lr: float) -> int:
    """The first step at which ``rank`` reported ``lr``."""
    return min(row["step"] for row in run.metrics if row["rank"] == rank and row["lr"] == lr)


def test_the_nodes_ranks_learn_commands_from_one_question_and_from_their_own_once_the_relay_is_gone(
        cluster, tmp_path: Path):
    gate = tmp_path / "gate"
    name = "relay-steered"
    run = nbtrain.launch(steps_until_the_gate, workers=2, name=name, feed_relay="always",
                         config={"gate": str(gate)})
    try:
        wait_for(lambda: _past(run, 3), timeout=90, message="both ranks stepping", describe=lambda: run.workers)
        supervisor = find_supervisor(name)
        wait_for(lambda: ray.get(supervisor.standing_questions.remote()) == 1, timeout=90,
                 message="the node's one question on the supervisor",
                 describe=lambda: (run.state, ray.get(supervisor.standing_questions.remote())))
        # both ranks wait for commands, through the relay: never a question of their own on the supervisor
        assert max(ray.get(supervisor.standing_questions.remote()) for _ in range(20)) == 1

        applied = run.adjust(lr=0.05, wait=True)
        wait_for(lambda: _past(run, applied), timeout=60, message="both ranks' rows past the change")
        assert _lr_from(run, 0, 0.05) == _lr_from(run, 1, 0.05) == applied  # every rank at the same step

        [relay] = _relays(name)
        ray.kill(ray.get_actor(relay, namespace=NAMESPACE), no_restart=True)
        # each rank now asks the supervisor itself, and still learns every command
        wait_for(lambda: ray.get(supervisor.standing_questions.remote()) == 2, timeout=60,
                 message="each rank's own question once its relay is gone",
                 describe=lambda: ray.get(supervisor.standing_questions.remote()))
        applied = run.adjust(lr=0.01, wait=True)
        wait_for(lambda: _past(run, applied), timeout=60, message="both ranks' rows past the second change")
        assert _lr_from(run, 0, 0.01) == _lr_from(run, 1, 0.01) == applied
    finally:
        gate.touch()
    run.wait(timeout=120)
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error
