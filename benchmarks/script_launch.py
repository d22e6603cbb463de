"""The same torchrun script, launched by ``torchrun`` and by ``nbtrain.launch_script``: launch → first step.

The script is ``notebooks/torchrun_script/train.py`` (2 ranks, gloo, CPU), unchanged. Its first step is
read from what the script itself writes: the wall time of the first scalar in rank 0's TensorBoard event
file, minus the moment the launch began (``torchrun`` started as a process, as a user starts it; nbtrain's
``launch_script`` called in this process, connected to an embedded cluster as a notebook is). nbtrain's
first launch is cold (new rank processes, ``warm=False``); the next ones reuse the warm workers, as a
notebook's second launch does (one untimed launch fills the pool first). Each variant runs ``--reps``
times, alternating; medians are printed.

    python benchmarks/script_launch.py [--reps 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _own_cluster import own_cluster

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "torchrun_script" / "train.py"
ARGS = ["--epochs", "1"]


def first_scalar_time(logdir: Path) -> float:
    """The wall time of rank 0's first scalar, as TensorBoard's reader sees it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir / "rank0"))
    events.Reload()
    return min(scalar.wall_time for scalar in events.Scalars("loss"))


def with_torchrun(where: Path) -> float:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    began = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
                    "--master_addr=127.0.0.1", f"--master_port={port}", str(SCRIPT), *ARGS],
                   cwd=where, check=True, capture_output=True, timeout=600)
    return first_scalar_time(where / "runs") - began


def with_nbtrain(where: Path, warm: bool, name: str) -> float:
    import os

    import nbtrain

    os.chdir(where)
    began = time.time()
    run = nbtrain.launch_script(SCRIPT, args=ARGS, workers=2, warm=warm, name=name)
    state = run.wait(timeout=600)
    if state != nbtrain.RunState.SUCCEEDED:
        raise RuntimeError(f"{name} ended {state}: {run.summary().get('error')}")
    return first_scalar_time(where / "runs") - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    timings: dict[str, list[float]] = {"torchrun": [], "nbtrain cold": [], "nbtrain warm": []}
    with own_cluster("nbtrain-bench-script-", num_cpus=4):
        with_nbtrain(Path(tempfile.mkdtemp(prefix="nbtrain-script-")), warm=True, name="bench-script-pool")  # untimed
        for rep in range(args.reps):
            for variant in timings:
                where = Path(tempfile.mkdtemp(prefix="nbtrain-script-"))
                if variant == "torchrun":
                    took = with_torchrun(where)
                else:
                    took = with_nbtrain(where, warm=variant.endswith("warm"), name=f"bench-script-{rep}-{variant[8:]}")
                timings[variant].append(took)
                print(f"  rep {rep + 1}: {variant}: {took:.2f} s", flush=True)
    torchrun = statistics.median(timings["torchrun"])
    print("\n| launch → first step (s, median) | " + " | ".join(timings) + " |")
    print("|---|" + "---|" * len(timings))
    print("| seconds | " + " | ".join(f"{statistics.median(v):.2f}" for v in timings.values()) + " |")
    print("| ratio to torchrun | " + " | ".join(f"{statistics.median(v) / torchrun:.2f}" for v in timings.values())
          + " |")


if __name__ == "__main__":
    main()
