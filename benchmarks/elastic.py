"""Elastic runs and the gradient noise scale, measured on this script's own loopback cluster::

    python benchmarks/elastic.py                 # ~4 min on the 2-core VM
    python benchmarks/elastic.py --out benchmarks/results/elastic.json

1. **Join → training at the new size**: an elastic run (``workers=(1, 2)``, ``resize_interval_s=1``)
   trains on 1 rank while the head has no room for a second; a node is added
   (``nbtrain cluster add-node``'s code); seconds from the node being up to the first row
   of the 2-rank attempt, split into noticing (the resize event) and restarting.
2. **Steps lost per node loss**, three ways the node goes while the run checkpoints every
   ``EVERY`` steps: killed (SIGKILL to its processes: no notice), removed (``nbtrain cluster
   remove-node``: SIGTERM, which Ray's node turns into a drain before it stops) and drained
   (``run.drain``). Steps lost = rank 0's last step before the loss minus the step the
   next attempt resumes from (negative: the checkpoint is a step past rank 0's last row).
3. **Cost of the gradient noise scale**: the benchmark's CNN (``workload.py``) on 2 DDP
   ranks, ``gns=False`` and ``gns=True`` alternating; median seconds between steps.

Side by side, in one run, as ratios; the figures go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_benchmarks import write_json  # noqa: E402

import workload  # noqa: E402  (shipped to the workers by value)
from _own_cluster import own_cluster  # noqa: E402

EVERY = 10          # steps between checkpoints in the node-loss runs
STEP_S = 0.1        # a training step's duration in the resize runs
GNS_STEPS = 120     # steps per gns on/off run
GNS_ROUNDS = 4      # on/off pairs, interleaved


def resize_fn(config: dict[str, Any]) -> None:
    """Steps from the latest checkpoint, saving every ``every`` steps and when the run asks."""
    import nbtrain

    ctx = nbtrain.get_context()
    saved = nbtrain.load_checkpoint()
    start = saved["step"] if saved else 0
    for step in range(start + 1, config["steps"] + 1):
        time.sleep(config["step_time"])
        nbtrain.report(step=step, world_size=ctx.world_size, resumed_from=start)
        if nbtrain.checkpoint_requested() or step % config["every"] == 0:
            nbtrain.save_checkpoint({"step": step})


def cnn_fn(config: dict[str, Any]) -> None:
    """The benchmark's CNN under DDP on synthetic CIFAR-shaped data; reports each step's wall and CPU time."""
    import torch

    import nbtrain

    torch.set_num_threads(1)
    ctx = nbtrain.get_context()
    images, labels = workload.make_shard(0, 1)
    model = nbtrain.prepare_model(workload.build_model())
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=workload.LR, momentum=0.9))
    loader = nbtrain.prepare_loader(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=workload.BATCH_SIZE, shuffle=True))
    loss_fn = torch.nn.CrossEntropyLoss()
    last, last_cpu = time.perf_counter(), time.process_time()
    step = 0
    while step < config["steps"]:
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            now, cpu = time.perf_counter(), time.process_time()  # CPU: the rank's every thread
            nbtrain.report(loss=loss.item(), step_s=now - last, cpu_s=cpu - last_cpu, world=ctx.world_size)
            last, last_cpu, step = now, cpu, step + 1
            if step >= config["steps"]:
                break


def _registered_at_fn(node_manager_port: int) -> float:
    """When the node with this raylet port registered with the cluster (the GCS's start time), in epoch seconds."""
    import ray

    infos = ray._private.worker.global_worker.gcs_client.get_all_node_info().values()
    return next(i.start_time_ms for i in infos if i.node_manager_port == node_manager_port) / 1000


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def join_and_loss(how: str) -> dict[str, Any]:
    """One elastic run: grows when a node joins, then loses it: ``killed`` (SIGKILL: no notice), ``removed``
    (``nbtrain cluster remove-node``: SIGTERM, which Ray turns into a drain first) or ``drained`` (``run.drain``)."""
    import os
    import signal

    import ray

    import nbtrain
    from nbtrain._client.local import added_nodes, local_nodes

    _registered_at = ray.remote(num_cpus=0)(_registered_at_fn)
    # each rank reserves the head's CPUs (an accounting reservation): the head holds one, a second needs a node
    head_cpus = int(ray.cluster_resources()["CPU"])
    try:
        run = nbtrain.launch(resize_fn, config={"steps": 100_000, "step_time": STEP_S, "every": EVERY},
                             workers=(1, 2), cpus_per_worker=head_cpus, resize_interval_s=1,
                             name=f"bench-elastic-{how}")
        _wait(lambda: run.state == nbtrain.RunState.RUNNING and any(w["step"] >= 5 for w in run.workers), 120,
              "1 rank training")
        node = local_nodes.add(num_cpus=head_cpus)
        joined = ray.get(_registered_at.remote(node.node_manager_port))
        _wait(lambda: any(r["world_size"] == 2 for r in run.metrics), 120, "training on 2 ranks")
        first_two = min(r["time"] for r in run.metrics if r["world_size"] == 2)
        noticed = min(e["time"] for e in run.events if e["kind"] == "resize" and e["message"].startswith("room"))
        _wait(lambda: min(r["step"] for r in run.metrics if r["world_size"] == 2) + 3 * EVERY
              <= max(r["step"] for r in run.metrics), 120, "a few checkpoints at 2 ranks")
        time.sleep(EVERY * STEP_S / 2)  # land the loss mid-way between two checkpoints, as chance would
        attempt = max(r["attempt"] for r in run.metrics)
        if how == "drained":
            head = next(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"])
            run.drain(next(w["node_id"] for w in run.workers if w["node_id"] != head))
        elif how == "removed":
            local_nodes.remove(node.pid)
        else:
            os.killpg(node.pid, signal.SIGKILL)  # the node's whole process group: raylet, its workers
        lost_at = time.time()
        _wait(lambda: any(r["attempt"] > attempt and r["world_size"] == 1 for r in run.metrics), 180,
              "training on 1 rank again")
        rows = run.metrics
        before = max(r["step"] for r in rows if r["attempt"] == attempt and r["rank"] == 0)
        after = [r for r in rows if r["attempt"] > attempt]
        resumed = min(r["resumed_from"] for r in after)
        back = min(r["time"] for r in after)
        run.stop()
    finally:
        added_nodes.remove_all()
    return {"join_to_new_size_s": first_two - joined, "join_noticed_s": noticed - joined,
            "steps_lost": before - resumed, "loss_to_training_s": back - lost_at}


def gns_cost() -> dict[str, Any]:
    import nbtrain

    medians: dict[bool, list[float]] = {False: [], True: []}
    for index in range(GNS_ROUNDS):
        for gns in (False, True):
            run = nbtrain.launch(cnn_fn, config={"steps": GNS_STEPS}, workers=2, gns=gns,
                                 name=f"bench-gns-{index}-{'on' if gns else 'off'}")
            run.wait(timeout=600, raise_on_failure=True)
            steps = [r["step_s"] for r in run.metrics if r["step"] > 20]
            medians[gns].append(statistics.median(steps))
            if gns:
                print(f"  gns at the end: {[r.get('gns') for r in run.metrics][-1]:.4g}", flush=True)
    off, on = statistics.median(medians[False]), statistics.median(medians[True])
    return {"step_s_without": off, "step_s_with": on, "gns_cost_fraction": on / off - 1,
            "rounds": {str(k): v for k, v in medians.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "elastic.json")
    args = parser.parse_args()
    import cloudpickle

    cloudpickle.register_pickle_by_value(workload)  # nbtrain workers cannot import benchmarks/
    results: dict[str, Any] = {}
    with own_cluster("nbtrain-bench-elastic-", num_cpus=3):
        for how in ("killed", "removed", "drained"):
            results[how] = join_and_loss(how)
            print(f"{how}: {results[how]}", flush=True)
        results["gns"] = gns_cost()
    gns = results["gns"]
    for how in ("killed", "removed", "drained"):
        part = results[how]
        print(f"node {how}: joined -> training at 2 ranks {part['join_to_new_size_s']:.1f} s (noticed after "
              f"{part['join_noticed_s']:.1f} s, resize_interval_s=1); lost -> training at 1 rank "
              f"{part['loss_to_training_s']:.1f} s, steps lost {part['steps_lost']} (checkpoint every {EVERY})")
    print(f"gradient noise scale: step {gns['step_s_without'] * 1000:.1f} ms without, "
          f"{gns['step_s_with'] * 1000:.1f} ms with ({gns['gns_cost_fraction']:+.1%})")
    write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
