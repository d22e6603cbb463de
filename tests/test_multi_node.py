"""Two Ray nodes on one machine: a second raylet joins the loopback head (`nbtrain cluster add-node`).

Ranks spread over both nodes know their node and local ranks; a checkpoint on
shared ``storage=`` is read by ranks on either node; a node lost mid-run
(`nbtrain cluster remove-node`, which ends its raylet) restarts the run from its
checkpoint on the node that is left.
"""

from __future__ import annotations

import os

import psutil
import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

import nbtrain
from nbtrain._client.entry.cli import main as nbtrain_cli
from nbtrain._client.local import local_nodes

from _train_fns import elastic_train


def _alive_nodes() -> list[dict]:
    return [node for node in ray.nodes() if node["Alive"]]


def _wait_for(condition, timeout: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture()
def second_node(cluster, capsys):
    """A 2-CPU node added with the CLI, removed afterwards whatever happened."""
    before = len(_alive_nodes())
    assert nbtrain_cli(["cluster", "add-node", "--cpus", "2"]) == 0
    pid = int(capsys.readouterr().out.strip())
    try:
        _wait_for(lambda: len(_alive_nodes()) == before + 1, 60, "the added node to join the cluster")
        yield pid
    finally:
        local_nodes.remove(pid)


def test_an_added_node_listens_on_loopback_only_and_ranks_spread_over_both_read_the_shared_checkpoint(
        second_node, tmp_path, capsys):
    """One added node for both (a node's start is most of each test): it listens on loopback only and is
    listed, then a run spreads over the two nodes."""
    listening = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != second_node:
                continue
            listening += [(proc.name(), c.laddr) for c in proc.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except (OSError, psutil.Error):
            continue
    assert listening, "found no listening socket of the added node"
    assert all(addr.ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _name, addr in listening), listening
    assert nbtrain_cli(["cluster", "status"]) == 0
    assert f"added node: pid {second_node}, 2 CPUs" in capsys.readouterr().out

    def train():
        ctx = nbtrain.get_context()
        saved = nbtrain.load_checkpoint()
        step = (saved["step"] if saved else 0) + 1
        nbtrain.report(step=step, node_rank=ctx.node_rank, local_rank=ctx.local_rank,
                       local_world_size=ctx.local_world_size, resumed_from=step - 1)
        nbtrain.save_checkpoint({"step": step})
        if ctx.attempt == 1 and ctx.rank == 0:
            raise RuntimeError("failing the first attempt on purpose")

    run = nbtrain.launch(train, workers=2, placement_strategy="STRICT_SPREAD", storage=str(tmp_path),
                         max_failures=1, name="two-nodes", warm=False)
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    rows = {(row["attempt"], row["rank"]): row for row in run.metrics}
    for attempt in (1, 2):
        assert sorted(rows[(attempt, r)]["node_rank"] for r in (0, 1)) == [0, 1]
        assert [rows[(attempt, r)]["local_rank"] for r in (0, 1)] == [0, 0]
        assert [rows[(attempt, r)]["local_world_size"] for r in (0, 1)] == [1, 1]
    # attempt 2's ranks, one on each node, both resumed from the checkpoint rank 0 wrote in attempt 1
    assert [rows[(2, r)]["resumed_from"] for r in (0, 1)] == [1, 1]
    assert any(tmp_path.rglob("*")), "the checkpoint is in storage="
    workers = run.workers
    assert len({w["node_id"] for w in workers}) == 2
    assert all("(node " in w["node"] for w in workers), [w["node"] for w in workers]  # one IP: ids tell them apart


def test_a_lost_node_restarts_the_run_from_its_checkpoint_on_the_node_left(second_node, tmp_path):
    def train(config):
        ctx = nbtrain.get_context()
        saved = nbtrain.load_checkpoint()
        start = saved["step"] if saved else 0
        for step in range(start + 1, start + config["steps"] + 1):
            nbtrain.report(step=step, resumed_from=start, node_rank=ctx.node_rank)
            nbtrain.save_checkpoint({"step": step})
            if ctx.attempt > 1 and step >= start + 2:
                return
            if ctx.attempt == 1:
                import time

                time.sleep(0.2)

    run = nbtrain.launch(train, config={"steps": 10_000}, workers=2, placement_strategy="SPREAD",
                         storage=str(tmp_path), max_failures=1, name="node-lost", warm=False)
    def spread_and_stepping() -> bool:
        workers = run.workers
        return len({w["node_id"] for w in workers}) == 2 and min(w["step"] for w in workers) >= 3

    _wait_for(spread_and_stepping, 120, "both ranks stepping, on two nodes")
    head = next(n["NodeID"] for n in _alive_nodes() if "node:__internal_head__" in n["Resources"])
    lost = {w["rank"] for w in run.workers if w["node_id"] != head}
    assert local_nodes.remove(second_node) is not None
    assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    died = [f for f in run.summary()["failures"] if f["attempt"] == 1]
    assert died and {f["rank"] for f in died if f["kind"] == "died"} & lost, died
    checkpoint_step = max(row["step"] for row in run.metrics if row["attempt"] == 1 and row["rank"] == 0)
    second = [row for row in run.metrics if row["attempt"] == 2]
    assert second and {row["node_rank"] for row in second} == {0}, "attempt 2 runs on the head alone"
    assert min(row["resumed_from"] for row in second) >= checkpoint_step - 1


def test_an_elastic_run_shrinks_when_a_node_is_lost_and_finishes(second_node):
    head = next(n for n in _alive_nodes() if "node:__internal_head__" in n["Resources"])
    # more CPUs than the added node has: on the head, which keeps 1 free (nothing else runs now)
    blocker = placement_group([{"CPU": head["Resources"]["CPU"] - 1}])
    ray.get(blocker.ready(), timeout=30)
    try:
        run = nbtrain.launch(elastic_train, config={"steps": 80, "step_time": 0.1, "every": 5},
                             workers=(1, 2), placement_strategy="STRICT_SPREAD", resize_interval_s=1,
                             name="elastic-shrink")
        _wait_for(lambda: run.state == nbtrain.RunState.RUNNING and len(run.workers) == 2
                  and min(w["step"] for w in run.workers) >= 6, 90, "2 ranks stepping, one on each node")
        assert local_nodes.remove(second_node) is not None
        assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    finally:
        remove_placement_group(blocker)
    said = [e["message"] for e in run.events if e["kind"] == "resize"]
    assert any("2 → 1 ranks: lost node" in m for m in said), said
    rows = run.metrics
    last = max(r["attempt"] for r in rows)
    shrunk = [r for r in rows if r["attempt"] == last]
    assert {r["world_size"] for r in shrunk} == {1} and {r["batch"] for r in shrunk} == {8}
    assert {r["batch"] for r in rows if r["attempt"] == 1} == {4}, "2 ranks shared min=1 rank's batch of 8"
    assert min(r["step"] for r in shrunk) == shrunk[0]["resumed_from"] + 1 > 1, "resumed from the checkpoint"
    assert max(r["step"] for r in shrunk) == 80
    assert run.summary()["max_failures"] == 0, "the loss cost no max_failures: there were none to spend"


def test_a_drained_node_gets_a_checkpoint_and_the_run_goes_on_without_it(second_node):
    head = next(n for n in _alive_nodes() if "node:__internal_head__" in n["Resources"])
    blocker = placement_group([{"CPU": head["Resources"]["CPU"] - 1}])  # the head keeps 1 CPU free
    ray.get(blocker.ready(), timeout=30)
    try:
        # no checkpoint of its own (every=1000): the only one is the one the drain asks for
        run = nbtrain.launch(elastic_train, config={"steps": 80, "step_time": 0.1, "every": 1000},
                             workers=(1, 2), placement_strategy="STRICT_SPREAD", resize_interval_s=1,
                             name="elastic-drain")
        _wait_for(lambda: run.state == nbtrain.RunState.RUNNING and len(run.workers) == 2
                  and min(w["step"] for w in run.workers) >= 6, 90, "2 ranks stepping, one on each node")
        with pytest.raises(nbtrain.NbtrainError, match="is the head node"):
            run.drain(head["NodeID"])
        with pytest.raises(nbtrain.NbtrainError, match="is no live node of the cluster"):
            run.drain("ffffffffff")
        added = next(w["node_id"] for w in run.workers if w["node_id"] != head["NodeID"])
        noticed_at = max(w["step"] for w in run.workers)
        said = run.drain(added[:8])
        assert f"Node {added[:6]} is draining" in said
        assert run.wait(timeout=180) == nbtrain.RunState.SUCCEEDED, run.error
    finally:
        remove_placement_group(blocker)
    resizes = [e["message"] for e in run.events if e["kind"] == "resize"]
    assert any(m.startswith("2 → 1 ranks: node") and "draining" in m for m in resizes), resizes
    rows = run.metrics
    last = [r for r in rows if r["attempt"] == max(r["attempt"] for r in rows)]
    assert {r["world_size"] for r in last} == {1}
    resumed = last[0]["resumed_from"]
    assert resumed >= noticed_at, "the checkpoint was taken after the notice"
    assert min(r["step"] for r in last) == resumed + 1, "no step lost beyond the checkpoint"
    assert {r["step"] for r in rows if r["attempt"] == 1 and r["rank"] == 0} >= set(range(1, resumed + 1))
    assert not run.summary().get("failures"), "a drain is no failure"
