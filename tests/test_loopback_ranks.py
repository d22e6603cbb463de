"""A run on the embedded cluster stays on this machine and private to its user: every socket its ranks
listen on is bound to 127.0.0.1, and the files it leaves in the home are owner-only."""

from __future__ import annotations

import ipaddress
import stat

from nbtrain._paths import nbtrain_home, run_index_dir, runs_dir, storage_root

import _reference_run
from _helpers import wait_for


def _on_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket bound to loopback
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_ranks_listen_on_loopback_only(reference_run):
    """Each rank of the reference run read the sockets it listened on while its process group was up."""
    listening = {rank: measured["listening"] for rank, measured in enumerate(reference_run.result)}
    assert all(listening.values()), listening
    everywhere = {rank: [f"{address}:{port}" for address, port in found
                         if not _on_loopback(ipaddress.ip_address(address))]
                  for rank, found in listening.items()}
    assert everywhere == {0: [], 1: []}, f"rank sockets listen beyond loopback: {everywhere}"


def test_the_runs_files_are_owner_only(reference_run):
    assert [measured["total"] for measured in reference_run.result] == [2.0, 2.0]
    name = _reference_run.NAME
    run_dir = storage_root() / name
    wait_for(lambda: (run_dir / "summary.json").exists(), 30, message="the finished run's files")
    written = [runs_dir() / f"{name}.json", run_dir / "metrics" / "000000000000.jsonl",
               run_dir / "events" / "000000000000.jsonl", run_dir / "state.json", run_dir / "summary.json",
               run_dir / "result.pkl", run_dir / "config.pkl", run_index_dir() / f"{name}.json",
               *(run_dir / "checkpoints").glob("checkpoint-*.pt")]
    assert len(written) == 9 and all(path.exists() for path in written), written
    directories = [nbtrain_home(), runs_dir(), storage_root(), run_index_dir(), run_dir, run_dir / "checkpoints",
                   run_dir / "metrics", run_dir / "events"]
    loose = [f"{path} {oct(stat.S_IMODE(path.stat().st_mode))}" for path in [*directories, *written]
             if path.stat().st_mode & 0o077]
    assert loose == []
