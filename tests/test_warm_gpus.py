"""Warm workers on GPUs: a worker is lent again only to a rank that gets the same GPUs it first had.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once per process; a warm worker handed other GPU ids would keep
using its first ones — another run's GPU. There is no GPU here: the cluster's GPUs are *fake*, Ray's
``GPU`` resource on a loopback cluster of its own (``num_gpus=2``), and Ray assigns their ids to the
ranks' bundles as it would real ones. The ranks report the ids nbtrain gave them and their process id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = """
import json, os
import nbtrain

def where(config):
    nbtrain.report(step=1)
    return {"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(nbtrain.get_context().device),
            "pid": os.getpid()}

def run(name, workers):
    done = nbtrain.launch(where, name=name, workers=workers, gpus_per_worker=1, backend="gloo")
    done.wait(timeout=180)
    assert done.state == nbtrain.RunState.SUCCEEDED, done.error
    return done.result

nbtrain.connect(num_cpus=2, num_gpus=2, progress=lambda message: None)
print(json.dumps({"one": run("one-gpu", 1), "two": run("two-gpus", 2), "again": run("one-gpu-again", 1)}))
nbtrain.disconnect()
"""


def test_a_relaunch_with_other_gpu_ids_gets_new_workers() -> None:
    home = Path(tempfile.mkdtemp(prefix="nbt-gpu-"))
    env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_AUTO_CONNECT")},
           "NBTRAIN_HOME": str(home)}
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, capture_output=True,
                              text=True, timeout=420, stdin=subprocess.DEVNULL, check=False)
    finally:
        subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=env, capture_output=True,
                       timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    [first] = seen["one"]
    assert first["device"] == "cuda:0" and first["gpus"] in ("0", "1")
    # Two ranks: each sees both GPUs and uses its own by index. The first run's worker saw one GPU as
    # cuda:0; its view (visible ids, index) differs from either rank's, so neither may reuse it.
    assert sorted(rank["gpus"] for rank in seen["two"]) == ["0,1", "0,1"]
    assert sorted(rank["device"] for rank in seen["two"]) == ["cuda:0", "cuda:1"]
    assert first["pid"] not in {rank["pid"] for rank in seen["two"]}
    # One rank again, on either GPU: it reuses the first run's worker only if it got that worker's GPU.
    [again] = seen["again"]
    assert (again["pid"] == first["pid"]) == (again["gpus"] == first["gpus"])
    assert again["pid"] not in {rank["pid"] for rank in seen["two"]}
