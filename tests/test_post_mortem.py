"""A rank that raises keeps its frames' local variables; ``run.debug()`` and ``%ray_debug`` open IPython's
debugger on them in the notebook, scripted here with the debugger's own commands.

The cluster tests run a 2-rank run on the session's loopback cluster whose rank 1 raises with known
locals, and read them back through the debugger: from the Run that launched it, through the magic, and
from a new Run attached after the run's supervisor exited (as after a kernel restart). Bad input
(a run that did not fail, a rank it does not have or that did not raise) is one line, and nothing else
happens. The quick tests capture an exception in this process and open the debugger on it.
"""

from __future__ import annotations

import io
import re
import sys

import cloudpickle
import numpy
import pytest
import torch
from IPython.core.error import UsageError

import nbtrain
from nbtrain._cluster.names import find_supervisor
from nbtrain._cluster.rank.inspection.post_mortem import capture
from nbtrain._views.debugging.debugger import post_mortem

from _helpers import ipython_shell, wait_for

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CAP_MB = 1.0


def _scale_up(step, loss):
    factor = loss * 2  # noqa: F841 - a local the debugger reads
    raise ValueError(f"loss exploded at step {step}")


def raise_with_known_locals(config):
    ctx = nbtrain.get_context()
    loss = torch.tensor(2.5)
    batch = torch.zeros(16, 3, 4, 4)
    step = 41
    huge = numpy.ones(2 * 2**20 // 8)  # 2 MB: more than the run's 1 MB cap
    note = "known"
    if ctx.rank == 1:
        _scale_up(step, loss)
    return note, huge.size, batch.shape


def _debugged(run_or_capture, commands, **kwargs):
    out = io.StringIO()
    if isinstance(run_or_capture, dict):
        post_mortem(run_or_capture, "Rank 1 of a test", commands, stdout=out)
    else:
        run_or_capture.debug(commands=commands, stdout=out, **kwargs)
    return ANSI.sub("", out.getvalue())


def _assert_the_known_locals(text):
    assert "Rank 1 of run" in text and "ValueError: loss exploded at step 41" in text, text
    assert "_scale_up()" in text and "raise_with_known_locals()" in text  # where: both frames
    assert re.search(r"-+> *\d+ +raise ValueError\(f\"loss exploded at step \{step\}\"\)", text), text  # list
    assert "\n41\n" in text  # p step (innermost frame)
    assert "tensor(5.0) <tensor shape=() dtype=float32 device=cpu min=5 max=5 mean=5>" in text  # p factor
    assert "(16, 3, 4, 4)" in text  # pp batch.shape, one frame up
    assert "'known'" in text  # p note
    assert "Kept as their repr only: huge in raise_with_known_locals (larger than" in text
    assert "array([1., 1., 1., ..., 1., 1., 1.]" in text  # p huge: its repr


COMMANDS = ["where", "p step", "p factor", "up", "pp batch.shape", "p note", "p huge", "down", "list"]


@pytest.fixture(scope="module")
def failed_run(cluster):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # before the per-test fixture that does it
    run = nbtrain.launch(raise_with_known_locals, workers=2, name="pm-known-locals", debug_capture_mb=CAP_MB)
    assert run.wait(timeout=180, raise_on_failure=False) == nbtrain.RunState.FAILED
    return run


def test_the_debugger_shows_the_failing_ranks_locals_and_source(failed_run):
    _assert_the_known_locals(_debugged(failed_run, COMMANDS))


def test_the_capture_stays_within_its_cap(failed_run):
    data = failed_run._call("post_mortem", 1, 1)
    assert data is not None and len(data) < CAP_MB * 2**20  # the 2 MB array was not sent


def test_ray_debug_magic_runs_scripted_commands(failed_run, capsys):
    shell = ipython_shell()
    shell.run_line_magic("ray_debug", f'{failed_run.name} --rank 1 --commands "p step; up; p note"')
    text = ANSI.sub("", capsys.readouterr().out)
    assert "Rank 1 of run 'pm-known-locals' (attempt 1): ValueError: loss exploded at step 41" in text, text
    assert "\n41\n" in text and "'known'" in text, text


def test_ray_debug_with_no_name_takes_the_run_launched_from_python(failed_run, capsys):
    """The docs' "the last run started or attached here" holds for nbtrain.launch() too, not only the magics."""
    shell = ipython_shell()
    launched = nbtrain.launch(raise_with_known_locals, workers=2, name="pm-launched-here", debug_capture_mb=CAP_MB)
    assert launched.wait(timeout=180, raise_on_failure=False) == nbtrain.RunState.FAILED
    shell.run_line_magic("ray_debug", '--rank 1 --commands "p step"')
    text = ANSI.sub("", capsys.readouterr().out)
    assert "Rank 1 of run 'pm-launched-here' (attempt 1): ValueError: loss exploded at step 41" in text, text
    nbtrain.attach(failed_run.name)  # attaching makes it the last run here
    shell.run_line_magic("ray_debug", '--rank 1 --commands "p step"')
    assert "of run 'pm-known-locals'" in ANSI.sub("", capsys.readouterr().out)


def test_after_the_supervisor_exited_a_new_run_handle_debugs_from_the_stored_files(failed_run):
    wait_for(lambda: find_supervisor(failed_run.name) is None, 60, message="the supervisor to exit")
    _assert_the_known_locals(_debugged(nbtrain.attach(failed_run.name), COMMANDS))


def test_bad_input_is_one_line_each(failed_run, reference_run):
    with pytest.raises(nbtrain.NbtrainError, match=r"^Run 'pm-known-locals' has no rank 5: its ranks are 0 to 1\."):
        failed_run.debug(rank=5, commands=["q"])
    with pytest.raises(nbtrain.NbtrainError, match=r"^Rank 0 of run 'pm-known-locals' did not raise \(rank 1 did\): "
                                                   r"open it with %ray_debug pm-known-locals --rank 1"):
        failed_run.debug(rank=0, commands=["q"])
    shell = ipython_shell()
    with pytest.raises(UsageError, match="did not raise"):
        shell.run_line_magic("ray_debug", f"{failed_run.name} --rank 0")
    fine = reference_run  # the suite's one succeeded run, made once
    with pytest.raises(nbtrain.NbtrainError, match=rf"^Run '{fine.name}' has no failed rank to debug: it is "
                                                   r"succeeded, and no rank raised\."):
        fine.debug()
    for error in (failed_run, fine):
        assert "\n" not in _message(error)
    with pytest.raises(nbtrain.NbtrainError, match=r"^run.debug\(commands=...\) takes debugger commands as a list "
                                                   r"of strings or one string .* got 123\.$"):
        failed_run.debug(commands=123)


def _message(run):
    try:
        run.debug(rank=7, commands=["q"])
    except nbtrain.NbtrainError as exc:
        return str(exc)
    raise AssertionError("no error")


@pytest.mark.quick
def test_a_huge_local_is_kept_as_its_repr_and_tensors_as_summaries():
    def inner(weights):
        big = numpy.zeros(10 * 2**20 // 8)  # noqa: F841 - a local the debugger reads
        raise RuntimeError("inner failed")

    try:
        inner(torch.arange(12.0).reshape(3, 4))
    except RuntimeError as exc:
        data = capture(exc, exc.__traceback__, 2**20)
    captured = cloudpickle.loads(data)
    assert len(data) < 2**20
    (frame,) = [f for f in captured["frames"] if f["function"] == "inner"]
    assert "pickle" not in frame["locals"]["big"]
    text = _debugged(captured, ["p weights", "pp weights.shape", "p big.shape"])
    assert "<tensor shape=(3, 4) dtype=float32 device=cpu min=0 max=11 mean=5.5>" in text, text
    assert "(3, 4)" in text
    assert "this ndarray was kept only as its repr (larger than" in text


class _Sharded(torch.Tensor):
    """Stands in for a DTensor (FSDP2's parameters): the whole tensor's min, max or mean would be a collective
    across the ranks; its shard on this rank is ``to_local()``."""

    def to_local(self) -> torch.Tensor:
        return torch.Tensor._make_subclass(torch.Tensor, self.detach()[:2])

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.__name__ in ("min", "max", "mean"):
            raise AssertionError(f"{func.__name__} of the whole sharded tensor: a collective")
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.quick
def test_a_sharded_tensor_is_summed_up_from_this_ranks_shard_never_by_a_collective():
    """A capture that ran DTensor collectives on its own thread ran on into the process's next run (a restart
    that took the warm process) and took part in its collectives: the restored checkpoint came back wrong."""
    from nbtrain._cluster.rank.inspection.post_mortem import _summary

    sharded = torch.Tensor._make_subclass(_Sharded, torch.tensor([1.0, 3.0, 100.0, 200.0]))
    summary = _summary(sharded)
    assert summary.shape == (4,), "the whole tensor's shape"
    assert summary.stats == {"min": 1.0, "max": 3.0, "mean": 2.0}, "this rank's shard's values"
