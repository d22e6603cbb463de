"""``runtime_env=``: Ray's own per-run environment for the ranks, checked before launch, and warm workers
reused only by runs of the same environment.

The checks run without a cluster (quick). The runs are on the session's loopback cluster: a
``working_dir`` of the notebook's machine that is deleted as soon as ``launch()`` returns (as a remote
cluster would never see it) still reaches the ranks, with ``env_vars`` beside ``env=``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import nbtrain
from nbtrain._exceptions import InvalidOptionError
from nbtrain._options import RunOptions

from _helpers import ipython_shell


@pytest.mark.quick
@pytest.mark.parametrize("runtime_env,expected", [
    (["pip"], "runtime_env (--runtime-env) must be a dict with text keys"),
    ({"pip_packages": ["timm"]}, "pip_packages is not one"),
    ({"env_vars": {"A": 1}}, "runtime_env['env_vars'] must be of type Dict[str, str]"),
    ({"pip": 3}, "runtime_env['pip'] must be of type str or List[str]"),
    ({"working_dir": "/no/such/folder"}, "/no/such/folder is not a valid path"),
    ({"env_vars": {"NBTRAIN_PROCESS": "x"}}, "without NBTRAIN_PROCESS in env_vars"),
])
def test_a_runtime_env_ray_would_refuse_is_refused_before_launch(runtime_env, expected):
    with pytest.raises(InvalidOptionError) as refused:
        RunOptions(runtime_env=runtime_env)
    assert expected in str(refused.value)
    assert "The magic takes JSON or the name of a notebook dict" in str(refused.value)


@pytest.mark.quick
def test_env_and_runtime_env_may_not_disagree():
    with pytest.raises(InvalidOptionError, match="env= and runtime_env\\['env_vars'\\] both set A differently"):
        RunOptions(env={"A": "1"}, runtime_env={"env_vars": {"A": "2"}})
    RunOptions(env={"A": "1"}, runtime_env={"env_vars": {"A": "1", "B": "2"}})  # the same value twice is fine


@pytest.mark.quick
def test_the_magic_takes_json_or_a_notebook_dict():
    ip = ipython_shell()
    result = ip.run_cell("%%ray_train --runtime-env '{\"pip\": [\"timm\"'\nx = 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "--runtime-env expects a JSON object in quotes" in str(result.error_in_exec)
    result = ip.run_cell("%%ray_train --runtime-env my_env\nx = 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "--runtime-env names the notebook variable 'my_env', which is not defined" in str(result.error_in_exec)
    ip.user_ns["my_env"] = {"pip_packages": []}
    result = ip.run_cell("%%ray_train --runtime-env my_env\nx = 1\n")
    assert "pip_packages is not one" in str(result.error_in_exec)


def reads_its_environment(config):
    """Returns what a rank finds: the working_dir's file, both kinds of variables, its process id."""
    import os as _os

    with open("notes.txt") as notes:  # the working_dir is the rank's current directory
        text = notes.read()
    nbtrain.report(step=1)
    return {"notes": text, "from_runtime_env": _os.environ.get("FROM_RUNTIME_ENV"),
            "from_env": _os.environ.get("FROM_ENV"), "pid": _os.getpid()}


def test_a_working_dir_deleted_after_launch_still_reaches_every_rank(cluster, tmp_path: Path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("shipped with the run")
    run = nbtrain.launch(reads_its_environment, name="runtime-env-working-dir", workers=2, warm=False,
                         env={"FROM_ENV": "env="},
                         runtime_env={"working_dir": str(folder), "env_vars": {"FROM_RUNTIME_ENV": "yes"}})
    shutil.rmtree(folder)  # what a cluster on another machine sees of it: nothing
    run.wait(timeout=180)
    assert run.state == nbtrain.RunState.SUCCEEDED, run.error
    assert [{k: v for k, v in found.items() if k != "pid"} for found in run.result] == [
        {"notes": "shipped with the run", "from_runtime_env": "yes", "from_env": "env="}] * 2


def test_warm_workers_are_reused_only_by_the_same_environment(cluster):
    def launch(name: str, value: str):
        run = nbtrain.launch(reads_pid, name=name, workers=2, env={"WARM_TEST_SHAPE": "runtime-env"},
                             runtime_env={"env_vars": {"WHICH_ENV": value}})
        run.wait(timeout=180)
        assert run.state == nbtrain.RunState.SUCCEEDED, run.error
        return {found["pid"] for found in run.result}, {found["env"] for found in run.result}

    first, _ = launch("runtime-env-a1", "a")
    again, _ = launch("runtime-env-a2", "a")
    other, seen = launch("runtime-env-b", "b")
    assert again == first  # the same environment: the same warm processes
    assert not other & first and seen == {"b"}  # another one: new processes, which have it
    for pid in first:
        assert _ended(pid)


def reads_pid(config):
    import os as _os

    nbtrain.report(step=1)
    return {"pid": _os.getpid(), "env": _os.environ.get("WHICH_ENV")}


def _ended(pid: int) -> bool:
    """The workers of the other environment were ended when the new shape leased (it is asked of the OS)."""
    from _helpers import pid_alive, wait_for

    wait_for(lambda: not pid_alive(pid), timeout=30, message=f"worker {pid} of the replaced environment to end")
    return True


def _reports_once() -> None:
    nbtrain.report(loss=1.0)


def test_a_package_pip_cannot_find_fails_the_run_in_pips_time_with_pips_words(cluster):
    """Ray would build the environment for each rank, 3 tries each (over 3 minutes here), then report its agent's
    traceback; the run fails in the time pip takes to say no, with pip's line and what to do."""
    run = nbtrain.launch(_reports_once, workers=2, name="runtime-env-no-such-package",
                         runtime_env={"pip": ["a-package-that-does-not-exist"]})
    assert run.wait(timeout=90, raise_on_failure=False) == nbtrain.RunState.FAILED
    error = run.error or ""
    assert error.startswith("runtime_env: pip cannot install a-package-that-does-not-exist: ERROR: "), error
    assert "No matching distribution found for a-package-that-does-not-exist" in error
    assert "internal error" not in error and "Traceback" not in error and "nbtrain/" not in error, error
    assert len(error.splitlines()) == 1, error


def test_a_working_dir_that_is_missing_is_named_at_launch(cluster, tmp_path: Path):
    missing = tmp_path / "no-such-folder"
    with pytest.raises(nbtrain.NbtrainError, match=r"runtime_env.*working_dir.*no-such-folder"):
        nbtrain.launch(_reports_once, workers=1, name="runtime-env-missing-dir",
                       runtime_env={"working_dir": str(missing)})
