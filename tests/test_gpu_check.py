"""``scripts/gpu-check``, the command to run where a GPU is lent, works: here (no GPU) it says so and
exits 0, and its CPU self-check runs every check (NCCL → gloo, the GPU → the CPU) on its own loopback
cluster and prints the table with every row ok."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-check"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "NBTRAIN_HOME")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env=env, stdin=subprocess.DEVNULL, check=False)


def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.fail("this machine has a GPU: run scripts/gpu-check itself and quote its table")
    done = _run()
    assert done.returncode == 0, done.stderr
    assert "no GPU here" in done.stdout


@pytest.mark.timeout(600)
def test_its_cpu_self_check_runs_every_check() -> None:
    done = _run("--cpu-self-check")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    table = done.stdout[done.stdout.index("check "):]
    for row in ("1-rank DDP over gloo", "precision bf16-mixed", "FSDP on one rank", "2 ranks sharing one device",
                "warm relaunch, same device, memory freed", "throughput vs torchrun (1 rank)"):
        assert row in table, table
    assert "FAIL" not in table, table
