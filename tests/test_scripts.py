"""A user's own torchrun script, unchanged, on the loopback cluster: ``nbtrain.launch_script``, the
``%ray_train`` line magic and a pasted ``%%ray_train`` cell give the final loss torchrun gives it on the
same seed; its helper module travels with it, its snapshot lands where the user looks and attempt 2
resumes from it; bad input is one line each."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import nbtrain
from nbtrain import InvalidOptionError, RunFailedError

from _helpers import ipython_shell

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "torchrun_script" / "train.py"
EPOCHS = "2"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def torchrun_loss(tmp_path_factory) -> float:
    """The script's final loss under torchrun itself, 2 processes on this machine."""
    where = tmp_path_factory.mktemp("torchrun")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
                    "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(SCRIPT), "--epochs", EPOCHS,
                    "--out", "loss.json"], cwd=where, check=True, timeout=300, capture_output=True)
    return float(json.loads((where / "loss.json").read_text())["final_loss"])


def test_launch_script_runs_it_as_torchrun_does(cluster, tmp_path, monkeypatch, torchrun_loss):
    monkeypatch.chdir(tmp_path)  # the folder the run is launched from: its relative paths land here
    run = nbtrain.launch_script(SCRIPT, args=["--epochs", EPOCHS, "--out", "loss.json", "--fail-once-after-epoch",
                                              "0"], workers=2, max_failures=1, name="script-launch")
    assert run.wait(timeout=240) == nbtrain.RunState.SUCCEEDED
    assert json.loads((tmp_path / "loss.json").read_text())["final_loss"] == pytest.approx(torchrun_loss, rel=1e-6)
    assert (tmp_path / "snapshot.pt").exists() and (tmp_path / "runs" / "rank1").is_dir()
    assert run.summary()["attempt"] == 2
    logs = run.logs()
    assert "resuming at epoch 1 from snapshot.pt" in logs, logs[-2000:]
    assert "failing once after epoch 0" in " ".join(f["summary"] or "" for f in run.summary()["failures"])


def test_the_line_magic_takes_options_before_the_script_and_its_arguments_after(cluster, tmp_path, monkeypatch,
                                                                                torchrun_loss):
    monkeypatch.chdir(tmp_path)
    shell = ipython_shell()
    assert shell.run_cell(f"%ray_connect {cluster.address}").error_in_exec is None
    result = shell.run_cell(f"%ray_train --workers 2 --name script-line --out run {SCRIPT} --epochs {EPOCHS} "
                            "--out loss.json --snapshot own.pt")
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["run"].state == nbtrain.RunState.SUCCEEDED
    assert json.loads((tmp_path / "loss.json").read_text())["final_loss"] == pytest.approx(torchrun_loss, rel=1e-6)
    assert (tmp_path / "own.pt").exists()


def test_a_pasted_script_runs_its_main_block_with_the_cells_args(cluster, tmp_path, monkeypatch, torchrun_loss):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the notebook beside the script imports its datautils
    shell = ipython_shell()
    assert shell.run_cell(f"%ray_connect {cluster.address}").error_in_exec is None
    result = shell.run_cell(f'%%ray_train --workers 2 --name script-cell --out run --args "--epochs {EPOCHS} '
                            f'--out loss.json"\n' + SCRIPT.read_text())
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["run"].state == nbtrain.RunState.SUCCEEDED
    assert json.loads((tmp_path / "loss.json").read_text())["final_loss"] == pytest.approx(torchrun_loss, rel=1e-6)


def test_exits_and_argparse_errors_are_the_scripts_outcome(cluster, tmp_path):
    (tmp_path / "ends.py").write_text("import sys\nprint('done early')\nsys.exit(0)\nraise SystemExit(3)\n")
    ended = nbtrain.launch_script(tmp_path / "ends.py", workers=2, name="script-exit-0")
    assert ended.wait(timeout=120) == nbtrain.RunState.SUCCEEDED
    run = nbtrain.launch_script(SCRIPT, args=["--epochs", "x"], workers=2, name="script-argparse")
    with pytest.raises(RunFailedError) as failed:
        run.wait(timeout=120)
    said = str(failed.value)
    assert "exited with code 2" in said and "argument --epochs: invalid int value: 'x'" in said, said


def test_bad_input_is_refused_before_any_rank_starts(cluster, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.py").write_text("def f(:\n")
    cases = [
        (lambda: nbtrain.launch_script(tmp_path / "missing.py"), "there is no file"),
        (lambda: nbtrain.launch_script(tmp_path / "notes.txt"), "is not a Python script"),
        (lambda: nbtrain.launch_script(tmp_path / "broken.py"), "has a syntax error at line 1"),
        (lambda: nbtrain.launch_script(SCRIPT, args=["--epochs", 5]), r"args=\.\.\.\) is a list of strings"),
        (lambda: nbtrain.launch_script(SCRIPT, args="--epochs 5"), r"args=\.\.\.\) is a list of strings"),
        (lambda: nbtrain.launch_script(SCRIPT, wokers=2), "did you mean workers"),
        (lambda: nbtrain.launch_script(SCRIPT, config={"lr": 1}), "has no config: a script reads its arguments"),
    ]
    for call, said in cases:
        with pytest.raises(InvalidOptionError, match=said):
            call()
    shell = ipython_shell()
    assert shell.run_cell(f"%ray_connect {cluster.address}").error_in_exec is None
    result = shell.run_cell("%ray_train --workers 2")
    assert isinstance(result.error_in_exec, UsageError)
    assert "%ray_train needs a script" in str(result.error_in_exec)
    assert not os.path.exists(tmp_path / "snapshot.pt")


SLOW_SCRIPT = '''import os
import time

import torch
import torch.distributed as dist


def train_step(model, optimizer, step):
    optimizer.zero_grad()
    loss = model(torch.ones(4, 2)).pow(2).mean()
    loss.backward()
    optimizer.step()
    if step == int(os.environ.get("FAIL_AT", "-1")):
        scale = loss.item() * 10  # a local the debugger reads
        raise ValueError(f"bad step {step}")
    time.sleep(0.02)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 100_000):
        train_step(model, optimizer, step)
'''


def test_a_script_run_has_what_every_run_has(cluster, tmp_path):
    """Stacks name the script's line, a profile of its steps, adjust on its own optimizer, stop; and a failing
    script's post-mortem opens on its own frames."""
    from _helpers import wait_for

    (tmp_path / "slow.py").write_text(SLOW_SCRIPT)
    run = nbtrain.launch_script(tmp_path / "slow.py", workers=2, name="script-inspected")
    try:
        wait_for(lambda: (run.summary().get("step") or 0) >= 5, timeout=120, message="the script's first steps")
        stacks = run.stacks()
        assert "slow.py" in str(stacks) and "train_step" in str(stacks), str(stacks)
        profile = run.profile(steps=3)
        assert profile.tables[0], profile
        applied = run.adjust(lr=0.01, wait=True)
        assert run.changes[-1]["step"] == applied and run.changes[-1]["args"]["lr"] == 0.01
        assert run.stop() == nbtrain.RunState.STOPPED
    finally:
        if not run.state.is_terminal:
            run.stop()
    failing = nbtrain.launch_script(tmp_path / "slow.py", workers=2, name="script-debugged", env={"FAIL_AT": "3"})
    with pytest.raises(RunFailedError, match="ValueError: bad step 3"):
        failing.wait(timeout=120)
    out = io.StringIO()
    failing.debug(commands="where; p scale", stdout=out)
    said = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # the debugger's colours
    assert "slow.py" in said and "train_step()" in said and "raise ValueError" in said, said
