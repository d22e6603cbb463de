"""Bad input gets a clear error within a second, naming the parameter, and starts nothing.

The table below is every launch option given a value of the wrong type or range:
each is refused by ``launch()`` itself with an ``InvalidOptionError`` that names
the parameter and its ``%%ray_train`` flag, says what was expected and what was
given, before any cluster is asked anything (so no run and no registry record).
The last test does the two that need the cluster: a ``storage=`` directory that
cannot be written, found by the notebook and, as on a remote cluster, by the
run's supervisor.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

import nbtrain
from nbtrain._client.launching import starting as launching
from nbtrain._paths import runs_dir

from _helpers import wait_for


def _noop() -> None:
    pass


HUGE = {f"key{i}": "x" * 100 for i in range(100_000)}

BAD = [
    # (keyword, value, what the message must say after "name (--flag) must be ")
    ("workers", True, "a whole number of at least 1, got True"),
    ("workers", 0, "a whole number of at least 1, got 0"),
    ("workers", -1, "a whole number of at least 1, got -1"),
    ("workers", 2.5, "a whole number of at least 1, got 2.5"),
    ("workers", (0, 2), "a whole number of at least 1, or (min, max) with 1 <= min <= max"),
    ("workers", (3, 2), "a whole number of at least 1, or (min, max) with 1 <= min <= max (--workers MIN:MAX), "
                        "got (3, 2)"),
    ("workers", (1, 2, 3), "a whole number of at least 1, or (min, max) with 1 <= min <= max "
                           "(--workers MIN:MAX), got (1, 2, 3)"),
    ("cpus_per_worker", math.nan, "a positive number, got nan"),
    ("cpus_per_worker", math.inf, "a positive number, got inf"),
    ("cpus_per_worker", "1", "a positive number, got '1'"),
    ("gpus_per_worker", -0.5, "0 or more, got -0.5"),
    ("max_failures", -1, "a whole number of 0 or more, got -1"),
    ("max_failures", True, "a whole number of 0 or more, got True"),
    ("stall_timeout_s", 0, "a positive number of seconds, got 0"),
    ("stall_timeout_s", "10", "a positive number of seconds, got '10'"),
    ("placement_timeout_s", -1, "a positive number of seconds, got -1"),
    ("collective_timeout_s", math.inf, "a positive number of seconds, got inf"),
    ("flush_interval_s", 100, "between 0.01 and 10 seconds, got 100"),
    ("total_steps", "100", "a whole number of at least 1, got '100'"),
    ("total_steps", 0, "a whole number of at least 1, got 0"),
    ("total_epochs", 1.5, "a whole number of at least 1, got 1.5"),
    ("config", [("lr", 0.1)], "a dict with text keys, got [('lr', 0.1)]"),
    ("config", {1: "a"}, "a dict with text keys, got {1: 'a'}"),
    ("env", {"OMP_NUM_THREADS": 1}, "a dict of text values (environment variables are text)"),
    ("env", {1: "x"}, "a dict with text keys"),
    ("env", {"A=B": "x"}, "variable names without '=' or NUL"),
    ("datasets", {"train": [1, 2, 3]}, "a dict of Ray Datasets (ray.data.Dataset), but 'train' is a list"),
    ("datasets", ["train"], "a dict with text keys"),
    ("storage", 5, "an absolute directory path that every node can reach"),
    ("storage", "checkpoints", "an absolute directory path that every node can reach, or a URI pyarrow.fs opens"),
    ("storage", "ftp://host/checkpoints", "an absolute directory path that every node can reach, or a URI pyarrow.fs "
                                          "opens (file://, s3://, gs://"),
    ("storage", "file://otherhost/checkpoints", "an absolute directory path that every node can reach, or a URI"),
    ("name", "bad name", "letters, digits, '-', '_' or '.'"),
    ("name", 7, "letters, digits, '-', '_' or '.'"),
    ("on_stall", "explode", "one of 'warn', 'fail', 'restart', got 'explode'"),
    ("placement_strategy", "pack", "one of 'PACK', 'SPREAD'"),
    ("feed_relay", True, "one of 'auto', 'always', 'never', got True"),
    ("warm", "yes", "True or False, got 'yes'"),
    ("warm_idle_s", -1, "a positive number of seconds, got -1"),
    ("resize_interval_s", 0, "a positive number of seconds, got 0"),
    ("scale_lr", "cubic", "one of 'linear', 'sqrt', got 'cubic'"),
    ("gns", "on", "True or False, got 'on'"),
    ("adaptive_batch", (64, 16), "(min, max) per-rank batch sizes with 1 <= min <= max"),
    ("adaptive_batch", 32, "(min, max) per-rank batch sizes with 1 <= min <= max"),
    ("adaptive_batch", (0, 16), "(min, max) per-rank batch sizes with 1 <= min <= max"),
    ("backend", "mpi", "one of 'gloo', 'nccl', got 'mpi'"),
    ("backend", "nccl", "'gloo' on a run without GPUs"),
    ("precision", "fp8", "one of 'bf16-mixed', '16-mixed', got 'fp8'"),
    ("loggers", ["tensorboard", "wandb"], "one of 'tensorboard', 'mlflow', got 'wandb'"),
    ("logger_dir", "runs/tb", "an absolute directory path on the head node, got 'runs/tb'"),
    ("wait", "yes", "True or False, got 'yes'"),
    ("resume", 1, "True or False, got 1"),
    ("stop_on_nan", None, "True or False, got None"),
    ("checkpoint_weights_only", "no", "True or False, got 'no'"),
    ("runtime_env", ["pip"], "a dict with text keys, like {'pip': ['timm']}, got ['pip']"),
    ("runtime_env", {"pip": 3}, "what Ray accepts: runtime_env['pip'] must be of type str or List[str]"),
    ("debug_capture_mb", -1, "between 0 and 1024 MB (0 keeps no post-mortem), got -1"),
    ("step_timing", "yes", "True or False, got 'yes'"),
    ("straggler_window_s", 0, "a positive number of seconds, got 0"),
    ("guard", ["nan"], "a dict of guard settings (nan, spike, spike_action, lr_factor, skip_batches, max_rewinds, "
                       "metric), got ['nan']"),
]


@pytest.mark.quick
@pytest.mark.parametrize(("keyword", "value", "expected"), BAD, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD])
def test_a_bad_option_is_refused_at_once_naming_it_and_nothing_is_started(keyword, value, expected):
    flag = nbtrain._options.flag_of(keyword)
    started = time.monotonic()
    with pytest.raises(nbtrain.InvalidOptionError) as error:
        nbtrain.launch(_noop, **{"name": "bad-input-run", keyword: value})
    assert time.monotonic() - started < 1.0
    assert f"{keyword} ({flag}) must be {expected}" in str(error.value)
    assert isinstance(error.value, ValueError)  # also what generic code catches for a bad argument
    assert not (runs_dir() / "bad-input-run.json").exists()


@pytest.mark.quick
def test_every_option_is_in_the_table():
    """The audit: a new option needs its bad values here too."""
    assert {keyword for keyword, _, _ in BAD} == {field.name for field in nbtrain._options.fields()}


@pytest.mark.quick
def test_a_huge_bad_value_gives_a_short_message():
    started = time.monotonic()
    with pytest.raises(nbtrain.InvalidOptionError) as error:
        nbtrain.launch(_noop, env=HUGE | {"BAD": 1})
    assert time.monotonic() - started < 1.0
    assert str(error.value).startswith("env (--env) must be a dict of text values")
    assert len(str(error.value)) < 400


@pytest.mark.quick
def test_a_config_value_that_cannot_be_sent_is_named():
    with pytest.raises(nbtrain.NotSerializableError, match=r"`config\['lock'\]` \(a threading.Lock\) cannot be sent"):
        nbtrain.launch(_noop, config={"lr": 0.1, "lock": threading.Lock()})


@pytest.mark.quick
@pytest.mark.parametrize("args, kwargs, expected", [
    ((["loss", 0.5],), {},
     r"report\(\) takes a dict of metrics or keywords, not list: write nbtrain.report\(loss=0.5\)"),
    (({"loss": 0.5},), {"loss": 0.4}, r"'loss' both in the dict and as a keyword: pass each metric once"),
])
def test_report_says_how_to_pass_metrics(args, kwargs, expected):
    with pytest.raises(TypeError, match=expected):
        nbtrain.report(*args, **kwargs)


@pytest.mark.quick
def test_a_storage_directory_that_cannot_be_written_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(nbtrain.StorageError, match=r"storage \(--storage\) must be a directory the cluster can "
                                                   r"write, but '.*/a-file/ckpt' cannot be written: Not a directory"):
        launching.check_writable(str(blocker / "ckpt"))
    launching.check_writable(str(tmp_path / "new" / "ckpt"))  # created if missing
    assert (tmp_path / "new" / "ckpt").is_dir() and not list((tmp_path / "new" / "ckpt").iterdir())


def test_storage_that_cannot_be_written_fails_fast_and_leaves_no_run(cluster, tmp_path, monkeypatch):
    """Found by the notebook on the embedded cluster; found by the supervisor where the notebook
    cannot see the cluster's disk (played here by turning the notebook's check off): either way
    a StorageError names the directory, and no run, actor or registry record is left. The second
    launch has warm=False: warm workers importing torch would otherwise take this 2-core machine
    from the supervisor, which lowers its own priority on purpose, and time that instead."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    started = time.monotonic()
    with pytest.raises(nbtrain.StorageError, match="a-file/ckpt' cannot be written: Not a directory"):
        nbtrain.launch(_noop, name="unwritable-storage", storage=str(blocker / "ckpt"))
    assert time.monotonic() - started < 1.0

    monkeypatch.setattr(launching, "check_writable", lambda storage: None)
    started = time.monotonic()
    with pytest.raises(nbtrain.StorageError) as error:
        nbtrain.launch(_noop, name="unwritable-storage", storage=str(blocker / "ckpt"), warm=False)
    took = time.monotonic() - started
    assert f"cannot keep its files in {blocker}/ckpt/unwritable-storage: Not a directory" in str(error.value)
    assert "storage (--storage)" in str(error.value)
    assert took < 5.0, f"the supervisor's refusal took {took:.1f} s"
    wait_for(lambda: launching.find_supervisor("unwritable-storage") is None, 10, message="the name to be free")
    assert "unwritable-storage" not in [run["name"] for run in nbtrain.runs()]
    assert not (runs_dir() / "unwritable-storage.json").exists()


@pytest.mark.quick
@pytest.mark.parametrize(("call", "said"), [
    (lambda: nbtrain.launch(_noop, wrokers=2), "launch() has no option 'wrokers' (did you mean workers?)"),
    (lambda: nbtrain.tune(_noop, space={}, metric="loss", num_sample=4),
     "tune() has no option 'num_sample' (did you mean num_samples?)"),
])
def test_an_unknown_keyword_is_named_with_the_closest_known_one(call, said):
    with pytest.raises(nbtrain.InvalidOptionError) as raised:
        call()
    assert str(raised.value).startswith(said + ". help(nbtrain."), str(raised.value)
    assert not list(runs_dir().glob("*.json"))


def test_unknown_keywords_of_a_fork_and_a_flag_of_a_magic_are_named_with_the_closest(reference_run):
    from _helpers import ipython_shell

    run = reference_run  # any ended run: the suite's one, made once
    with pytest.raises(nbtrain.InvalidOptionError, match=r"^run.fork\(\) has no option 'wrokers' \(did you mean "
                                                         r"workers\?\); 'max_failure' \(did you mean max_failures\?\)"):
        run.fork(wrokers=2, max_failure=1)
    shell = ipython_shell()
    result = shell.run_cell("%%ray_train --wrokers 2\nx = 1\n")
    assert "did you mean --workers instead of --wrokers?" in str(result.error_in_exec)
    result = shell.run_cell("%%ray_tune --metirc loss\nx = 1\n")
    assert str(result.error_in_exec).startswith("%%ray_tune: ") and "did you mean --metric" in str(
        result.error_in_exec)


def _reports_loss() -> None:
    for step in range(3):
        nbtrain.report(step=step, loss=1.0 / (step + 1), accuracy=0.5)


def test_compare_names_the_metrics_the_runs_have_and_takes_one_name_as_one_run(cluster):
    run = nbtrain.launch(_reports_loss, workers=1, name="bad-input-compare")
    run.wait(timeout=120)
    with pytest.raises(nbtrain.InvalidOptionError, match=r"^compare\(metric='nope'\): none of the runs reports "
                                                         r"'nope'; they report 'accuracy', 'loss'\. Give one of those"):
        nbtrain.compare([run], metric="nope")
    comparison = nbtrain.compare("bad-input-compare", metric="loss")  # a string is one run, not its letters
    assert [row["run"] for row in comparison.table()] == ["bad-input-compare"]
