"""A live run as a kernel, on the session's loopback cluster with real DDP (gloo): ``run.exec`` reads and runs
code on every rank between two steps, ``run.patch`` changes the loop's code at one step on every rank and a
restarted attempt keeps it; ``%%ray_exec`` / ``%%ray_patch`` on a ``%%ray_train`` cell's run, and a script's."""

from __future__ import annotations

import os
import time

import pytest

import nbtrain
from nbtrain._exceptions import NbtrainError

from _helpers import ipython_shell, wait_for


def scale(x):
    """Looked up by name in the loop each step: what a patch changes."""
    return x


def scaled_loop(config):
    """Two ranks of DDP, 0.05 s a step, until stopped; rank 0 fails once when the test leaves its marker."""
    import torch

    torch.manual_seed(0)
    model = nbtrain.prepare_model(torch.nn.Linear(4, 1))
    optimizer = nbtrain.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    for step in range(1, 100_000):
        value = scale(1.0)
        loss = torch.nn.functional.mse_loss(model(torch.ones(8, 4)), torch.zeros(8, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        nbtrain.report(scaled=value, loss=float(loss))
        if nbtrain.get_context().rank == 0 and os.path.exists(config["fail_marker"]):
            os.remove(config["fail_marker"])
            raise RuntimeError(f"planted failure at step {step}")
        time.sleep(0.05)


def _last_step(run) -> int:
    run.refresh()
    workers = run.workers  # read once: a restarting attempt empties the table between two reads
    return min((w.get("step") or 0) for w in workers) if workers else 0


def _first_patched(run, attempt: int) -> dict[int, int]:
    """Each rank's first step of ``attempt`` whose row used the patched ``scale``."""
    first: dict[int, int] = {}
    for row in run.metrics:
        if row["attempt"] == attempt and row["scaled"] == 2.0:
            first.setdefault(row["rank"], row["step"])
    return first


def test_exec_reads_the_ranks_and_patch_changes_the_loop_at_one_step_even_after_a_restart(cluster, tmp_path, capsys):
    marker = tmp_path / "fail-now"
    run = nbtrain.launch(scaled_loop, name="live-code", workers=2, max_failures=1,
                         config={"fail_marker": str(marker)})
    try:
        wait_for(lambda: _last_step(run) >= 5, timeout=120, message="the run to take 5 steps")

        weights = run.exec("float(model.module.weight.detach().sum())")
        assert set(weights) == {0, 1} and weights[0] == weights[1]  # DDP's replicas, read at the same step
        assert run.exec("print('step', step, 'of rank', nbtrain.get_context().rank)\nstep") is not None
        printed = capsys.readouterr().out
        assert "[rank 0] step " in printed and "[rank 1] step " in printed

        with pytest.raises(NbtrainError) as raised:
            run.exec("x = 1\n1 / 0")
        said = str(raised.value)
        assert "the code raised on rank(s) [0, 1]; the run goes on training" in said
        assert said.count('File "<run.exec') == 2 and "1 / 0" in said and "ZeroDivisionError" in said
        before = _last_step(run)
        wait_for(lambda: _last_step(run) >= before + 3, timeout=60, message="training to go on after the error")

        with pytest.raises(nbtrain.InvalidOptionError, match="is not valid Python"):
            run.exec("1 +")
        with pytest.raises(nbtrain.InvalidOptionError, match=r"its training code has no scael; it has .*scale"):
            run.patch("def scael(x):\n    return 2 * x\n")

        step = run.patch("def scale(x):\n    return 2 * x\n")
        wait_for(lambda: len(_first_patched(run, 1)) == 2 and _last_step(run) >= step + 3, timeout=60,
                 message="both ranks' rows past the patch")
        first = _first_patched(run, 1)
        assert first[0] == first[1] and first[0] in (step, step + 1), (first, step)
        assert all(row["scaled"] == 2.0 for row in run.metrics if row["attempt"] == 1 and row["step"] > first[0])
        [patch] = [c for c in run.changes if c["kind"] == "patch"]
        assert patch["description"] == f"patched scale at step {step}"
        assert run.summary()["patches"] == 1  # what the lab sidebar's "patched" badge counts

        marker.touch()  # rank 0 fails; the second attempt starts the loop again, and the patch at its step
        # the rows themselves: the summary can say attempt 2 while the workers' table still holds attempt 1's steps
        wait_for(lambda: len(_first_patched(run, 2)) == 2, timeout=120,
                 message="the restarted attempt past the patch's step",
                 describe=lambda: (run.summary()["attempt"], _first_patched(run, 2)))
        again = _first_patched(run, 2)
        assert again == first, (again, first)
        assert all(row["scaled"] == 2.0 for row in run.metrics if row["attempt"] == 2 and row["step"] > again[0])
        assert all(row["scaled"] == 1.0 for row in run.metrics if row["attempt"] == 2 and row["step"] < step)
    finally:
        run.stop()


SCRIPT = '''
import time
import torch

def scale(x):
    return x

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100_000):
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.05)
'''


def test_a_script_that_makes_no_nbtrain_call_is_read_and_patched_at_its_optimizers_steps(cluster, tmp_path):
    (tmp_path / "loop.py").write_text(SCRIPT)
    run = nbtrain.launch_script(tmp_path / "loop.py", workers=1, name="live-code-script")
    try:
        assert wait_for(lambda: _try_exec(run, "step"), timeout=120, message="the script's first steps") >= 0
        assert run.exec("scale(3.0)") == {0: 3.0}
        run.patch("def scale(x):\n    return -x\n")
        assert run.exec("scale(3.0)") == {0: -3.0}
    finally:
        run.stop()


def _try_exec(run, source: str):
    """The value of ``source`` on rank 0, or None while the script has taken no step yet."""
    try:
        return run.exec(source, timeout=10)[0]
    except NbtrainError as error:
        if "no step boundary" in str(error) or "no rank is running" in str(error):
            return None
        raise


@pytest.fixture(scope="module")
def ip(cluster):
    shell = ipython_shell()
    assert shell.run_cell(f"%ray_connect {cluster.address}").error_in_exec is None
    return shell


def test_the_magics_run_a_cell_on_a_ray_train_cells_ranks_and_patch_its_code(ip, capsys):
    result = ip.run_cell('''%%ray_train --workers 2 --name live-code-cell --bg --out run
import time
def bump(x):
    return x
for step in range(1, 100_000):
    nbtrain.report(bumped=bump(step) - step)
    time.sleep(0.05)
''')
    assert result.error_in_exec is None, result.error_in_exec
    run = ip.user_ns["run"]
    try:
        wait_for(lambda: _last_step(run) >= 3, timeout=120, message="the cell's run to take 3 steps")
        shown = ip.run_cell("%%ray_exec live-code-cell\nbump(1) + rank")
        assert shown.error_in_exec is None, shown.error_in_exec
        assert dict(shown.result) == {0: 1, 1: 2}
        assert "<th>rank</th>" in shown.result._repr_html_()
        patched = ip.run_cell("%%ray_patch live-code-cell\ndef bump(x):\n    return x + 10\n")
        assert patched.error_in_exec is None, patched.error_in_exec
        assert "patched bump at step " in capsys.readouterr().out
        wait_for(lambda: {row["rank"] for row in run.metrics if row["bumped"] == 10} == {0, 1}, timeout=60,
                 message="both ranks' rows with the patched bump")
        refused = ip.run_cell("%%ray_patch live-code-cell\ndef bmup(x):\n    return x\n")
        assert "its training code has no bmup; it has " in str(refused.error_in_exec)
        assert "bump" in str(refused.error_in_exec)
    finally:
        run.stop()
