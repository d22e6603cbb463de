"""The suite's reference run: one normal 2-rank DDP run on the session cluster that every test which only
reads what such a run leaves shares (``reference_run`` in ``tests/conftest.py``, made once per test run and
kept from the modules' clean-up). Each of those tests used to launch a run of its own for one fact.

Each rank trains a small CNN with ``prepare_model`` (counting its page faults per step: ``test_allocator``),
joins an all-reduce and, while its process group is up, reads the TCP sockets it listens on
(``test_loopback_ranks``) and its threads' niceness (``test_priority``), saves a checkpoint, then reports two
rows of every kind of value (``test_run_data``). What it measured is its result, one dict per rank.
"""

from __future__ import annotations

import ipaddress
import math
import os
from pathlib import Path
from typing import Any

import nbtrain

NAME = "reference"
CONFIG = {f"key{i}": "v" * 200 for i in range(5000)}  # about 1 MB: a config far beyond what a summary shows


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on (IPv4 and IPv6), from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                hex_address, hex_port = local.split(":")
                raw = bytes.fromhex(hex_address)  # the kernel prints each 32-bit word in host (little-endian) order
                packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((str(ipaddress.ip_address(packed)), int(hex_port, 16)))
    return found


def thread_niceness(pid: int) -> list[int]:
    """Niceness of every thread of ``pid``: on Linux it is per thread."""
    found: list[int] = []
    if not os.path.exists(f"/proc/{pid}/task"):  # the process ended meanwhile (a finished run's supervisor)
        return found
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found.append(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def page_faults_per_step() -> float:
    """Median minor page faults of the training thread per SGD step of a small CNN (8 MiB activations per layer,
    as in the benchmark), after warm-up. The median, because the heap may still grow once after warm-up."""
    import resource
    import statistics

    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nbtrain.prepare_model(nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(1024, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(5):
        step()
    faults = []
    for _ in range(11):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return float(statistics.median(faults))


def reference_training(config: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    faults = page_faults_per_step()
    total = torch.ones(1)
    dist.all_reduce(total)
    measured = {"page_faults_per_step": faults, "total": total.item(), "listening": listening(os.getpid()),
                "niceness": max(thread_niceness(os.getpid()))}
    nbtrain.save_checkpoint({"total": total})
    rank = nbtrain.get_context().rank
    # keywords, then a dict (Ray Train's style) with a keyword beside it: the same rows
    nbtrain.report(step=1, rank=99, attempt=7, time="noon", phase="warmup",
                   loss=math.nan, up=math.inf, down=-math.inf, lr=0.1 * (rank + 1))
    nbtrain.report({"step": 2, "rank": 99, "attempt": 7, "time": "noon", "phase": "main",
                    "loss": math.nan, "up": math.inf, "down": -math.inf}, lr=0.1 * (rank + 1))
    return measured
