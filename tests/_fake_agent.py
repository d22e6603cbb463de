"""A stand-in for ``python -m nbtrain agent`` in the lab server tests (run as a script).

It speaks the agent's protocol (one JSON list of ``nbtrain`` arguments per
line in, one ``{"ok", "output"}`` line out) and records every call in
``$NBTRAIN_HOME/calls.jsonl``. What "the cluster" says is written by the test:

    $NBTRAIN_HOME/fake-cluster/<name>.json    a run as the cluster reports it (a RunRecord
                                              with its cluster's "address")
    $NBTRAIN_HOME/fake-cluster/clusters.json  {address: {"nodes": n, "resources": {...}}}

A cluster is reachable when one of those files names its address. Then
``runs --json --address A`` answers what the real command prints
(``{"address", "cluster", "runs"}``) and ``stop NAME --address A`` marks that
run stopped on the fake cluster. Otherwise both fail with a connection error.
``pause`` / ``resume NAME --address A`` set or clear its ``paused_at`` (7). ``stop crash*`` makes the agent die.
"""

import json
import os
import sys
import time

home = os.environ["NBTRAIN_HOME"]
cluster_dir = os.path.join(home, "fake-cluster")


def read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cluster_runs(address):
    names = sorted(n for n in os.listdir(cluster_dir) if n.endswith(".json") and n != "clusters.json") \
        if os.path.isdir(cluster_dir) else []
    runs = {}
    for name in names:
        run = read(os.path.join(cluster_dir, name))
        if run and run.get("address") == address:
            runs[run["name"]] = run
    return runs


def answer(argv):
    address = argv[argv.index("--address") + 1] if "--address" in argv else "ray://127.0.0.1:10001"
    clusters = read(os.path.join(cluster_dir, "clusters.json")) or {}
    runs = cluster_runs(address)
    if address not in clusters and not runs:
        return False, f"Nothing is listening at {address} (connection refused). Is the cluster running?"
    if argv[0] == "runs":
        cluster = {"address": address, "kind": "remote", "nodes": 1,
                   "resources": {"CPU": [0, 2], "GPU": [0, 0]}, **clusters.get(address, {}), "updated": time.time()}
        records = [{**run, "updated": time.time()} for run in runs.values()]
        return True, json.dumps({"address": address, "cluster": cluster, "runs": records})
    name = argv[1]
    if name not in runs:
        return False, f"nbtrain: No run named {name!r} on {address}. Runs there: {', '.join(runs) or 'none'}."
    path = os.path.join(cluster_dir, f"{name}.json")
    if argv[0] in ("pause", "resume"):
        paused = runs[name].get("paused_at") is not None
        if paused == (argv[0] == "pause"):
            return False, f"nbtrain: Run {name!r} cannot be {argv[0]}d: it is {'' if paused else 'not '}paused."
        run = {**runs[name], "paused_at": 7 if argv[0] == "pause" else None}
        said = f"Run {name!r} pauses at step 7." if argv[0] == "pause" else f"Run {name!r} resumed."
    else:
        run = {**runs[name], "state": "stopped", "ended": time.time()}
        said = f"Run {name!r} stopped."
    with open(path + ".tmp", "w") as f:
        json.dump(run, f)
    os.replace(path + ".tmp", path)
    return True, said


for line in sys.stdin:
    argv = json.loads(line)
    with open(os.path.join(home, "calls.jsonl"), "a") as calls:
        calls.write(json.dumps({"time": time.time(), "argv": argv, "pid": os.getpid()}) + "\n")
    if argv[0] == "stop" and argv[1].startswith("crash"):
        sys.exit("fake agent: segmentation fault (core dumped)")
    ok, output = answer(argv)
    print(json.dumps({"ok": ok, "output": output}), flush=True)
