"""A run on the embedded cluster stays on this machine and private to its user: every socket its ranks
listen on is bound to 127.0.0.1, and the files it leaves in the home are owner-only."""

from __future__ import annotations

import ipaddress
import os
import stat
import sys
from pathlib import Path

import cloudpickle
import pytest

import nbtrain
from nbtrain._paths import nbtrain_home, run_index_dir, runs_dir, storage_root

from _helpers import wait_for


def hold_until_released(config):
    """Join the process group, save a checkpoint, report, then wait (ranks keep their sockets) for the test."""
    import time

    import torch
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)
    nbtrain.save_checkpoint({"total": total})
    nbtrain.report(step=1, total=total.item())
    deadline = time.monotonic() + 120
    while not os.path.exists(config["release"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return total.item()


def _listening(pid: int) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
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
                found.append((ipaddress.ip_address(packed), int(hex_port, 16)))
    return found


def _on_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket bound to loopback
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.fixture(scope="module")
def held_run(cluster, tmp_path_factory):
    """A 2-rank run whose ranks sit in their process group until the test lets them go."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # before the per-test fixture that does it
    release = tmp_path_factory.mktemp("loopback") / "release"
    run = nbtrain.launch(hold_until_released, workers=2, config={"release": str(release)}, name="loopback-ranks")
    try:
        yield run, release
    finally:
        release.touch()
        run.wait(timeout=120, raise_on_failure=False)


def test_ranks_listen_on_loopback_only(held_run):
    run, _release = held_run
    wait_for(lambda: {row["rank"] for row in run.metrics} == {0, 1} or run.state.is_terminal, timeout=120,
             message="both ranks to join the process group and report", describe=lambda: run.state)
    assert run.state == nbtrain.RunState.RUNNING, run.error
    pids = [worker["pid"] for worker in run.workers]
    listening = {pid: _listening(pid) for pid in pids}
    assert len(pids) == 2 and all(listening.values()), listening
    everywhere = {pid: [f"{address}:{port}" for address, port in found if not _on_loopback(address)]
                  for pid, found in listening.items()}
    assert everywhere == {pid: [] for pid in pids}, f"rank sockets listen beyond loopback: {everywhere}"


def test_the_runs_files_are_owner_only(held_run):
    run, release = held_run
    release.touch()
    assert run.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    assert run.result == [2.0, 2.0]
    run_dir = storage_root() / "loopback-ranks"
    wait_for(lambda: (run_dir / "summary.json").exists(), 30, message="the finished run's files")
    written = [runs_dir() / "loopback-ranks.json", run_dir / "metrics" / "000000000000.jsonl",
               run_dir / "events" / "000000000000.jsonl", run_dir / "state.json", run_dir / "summary.json",
               run_dir / "result.pkl", run_dir / "config.pkl", run_index_dir() / "loopback-ranks.json",
               *(run_dir / "checkpoints").glob("checkpoint-*.pt")]
    assert len(written) == 9 and all(path.exists() for path in written), written
    directories = [nbtrain_home(), runs_dir(), storage_root(), run_index_dir(), run_dir, run_dir / "checkpoints",
                   run_dir / "metrics", run_dir / "events"]
    loose = [f"{path} {oct(stat.S_IMODE(path.stat().st_mode))}" for path in [*directories, *written]
             if path.stat().st_mode & 0o077]
    assert loose == []
