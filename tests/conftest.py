"""One loopback Ray cluster per test session, reached over ray:// as users do.

NBTRAIN_HOME points at a throwaway directory *before* nbtrain is imported, so
the session's cluster, token and run registry never touch the user's.

Browser tests (marker ``browser``) need Playwright and Debian's Chromium; on a
machine without them each one fails at setup with the command that installs
them: a skipped browser test would let the suite pass without a browser.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ["NBTRAIN_HOME"] = tempfile.mkdtemp(prefix="nbtrain-test-home-")  # always fresh, never the user's
os.environ["NBTRAIN_FAULT_DISK_FULL"] = os.path.join(os.environ["NBTRAIN_HOME"], "fault-disk-full")  # see history_log
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# A Ray call made while not connected raises, in this process and every kernel or driver a test
# starts, instead of starting a private Ray inside it (which took this process down with it).
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"

import cloudpickle
import pytest

import nbtrain
from nbtrain._client.local import local_cluster
from nbtrain._client.warm import WARM_START_ENV

from _jupyterlab import browser_setup_problem

TEST_CPUS = 4  # logical CPUs: room for 2 workers + a second small run on 2 real cores


LANES = {"session-cluster": True, "own-processes": False}  # lane -> whether its tests use the session cluster


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane", choices=sorted(LANES), default=None,
        help="only the tests that use the session's cluster, or only those that do not (each of those starts "
             "what it needs, if anything): scripts/run-tests runs the two lanes side by side")


# The oldest-Ray tier (scripts/run-tests runs `-m oldest_ray` in a virtualenv with the oldest Ray nbtrain
# supports): one existing test for each thing a Ray release could break, marked here rather than copied.
# A sweep on it is test_connect_driver.py's (Tune's grid, each trial a run); ASHA's choices are Tune's own.
OLDEST_RAY_TIER = (
    "test_connect.py::test_client_port_refuses_a_connection_without_the_token",
    "test_metrics_streaming.py::test_rows_arrive_live_and_the_cursor_neither_drops_nor_repeats",
    "test_magic_runs.py::test_showing_a_dashboard_again_leaves_one_long_poll_and_the_feed_flowing",
    "test_warm_workers.py::test_a_relaunch_reuses_the_workers_started_afresh_and_reaches_its_first_step_sooner",
    "test_steering.py::test_a_live_run_is_steered_on_every_rank_at_the_same_step",
    "test_post_mortem.py::test_the_debugger_shows_the_failing_ranks_locals_and_source",
    "test_ray_train_code.py::test_the_user_guide_example_runs_unchanged_under_the_drop_in_trainer",
    "test_multi_node.py::test_a_drained_node_gets_a_checkpoint_and_the_run_goes_on_without_it",
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m quick``, a test module that marks nothing quick is not even imported: importing them all
    (Lightning, transformers, MLflow, ...) was a fifth of the quick tier's minute, for tests it deselects."""
    if (config.getoption("markexpr") == "quick" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")):
        return "mark.quick" not in collection_path.read_text(encoding="utf-8") or None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.removeprefix("tests/") in OLDEST_RAY_TIER:
            item.add_marker(pytest.mark.oldest_ray)
        if "cluster" in item.fixturenames:  # the marker follows the fixture: never kept by hand (it drifted)
            item.add_marker(pytest.mark.cluster)
            if item.get_closest_marker("quick") is not None:
                raise pytest.UsageError(f"{item.nodeid} is marked quick but uses the session cluster: the quick tier "
                                        "starts no cluster (its minute holds only tests that need none)")
    lane = config.getoption("--lane")
    if lane is None:
        return
    kept = [item for item in items if ("cluster" in item.fixturenames) == LANES[lane]]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's throwaway home goes when the session passed (hundreds piled up in /tmp); a failed session
    keeps it, with its cluster's logs and the runs' files, to read what went wrong."""
    session = getattr(config, "_nbtrain_session", None)
    if session is not None and session.testsfailed == 0 and not _session_cluster_running():
        shutil.rmtree(os.environ["NBTRAIN_HOME"], ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._nbtrain_session = session  # type: ignore[attr-defined]


def _session_cluster_running() -> bool:
    from nbtrain._client.local import local_cluster

    return _session_cluster != [] and local_cluster.status() is not None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A browser test on a machine without Playwright or Chromium is an error saying what to install."""
    if item.get_closest_marker("browser") is not None and (problem := browser_setup_problem()):
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def cluster():
    """The embedded local cluster, started by nbtrain's own code (loopback + token)."""
    started = time.monotonic()
    try:
        connected = nbtrain.connect(num_cpus=TEST_CPUS, progress=lambda msg: print(msg, file=sys.stderr))
        print(f"test cluster up in {time.monotonic() - started:.1f} s: {connected.address}", file=sys.stderr)
        _session_cluster.append(connected.address)
        # The kernels, servers and drivers the session lane's tests start connect without warming (as under
        # `nbtrain lab --no-warm`): most never launch the default shape. A process sample of a full run (every
        # 3 s) saw 16 of the 26 rank processes those sessions had started never run a function, each a process
        # start and `import torch` (~2.5 s of CPU) on a machine the two lanes keep busy. This session warmed its
        # own above; test_warm_workers.py and the tutorials (the other lane, their own clusters) keep the
        # warming a user's kernel does.
        os.environ[WARM_START_ENV] = "0"
        yield connected
    finally:  # also when connect() itself failed after starting the cluster
        nbtrain.disconnect()
        local_cluster.stop()


@pytest.fixture(scope="session")
def reference_run(cluster):
    """The suite's reference run (``tests/_reference_run.py``), ended: made once, read by every test that only
    reads what a normal run leaves, and kept by the modules' clean-up below."""
    import _reference_run

    cloudpickle.register_pickle_by_value(_reference_run)
    run = nbtrain.launch(_reference_run.reference_training, name=_reference_run.NAME, workers=2,
                         config=_reference_run.CONFIG)
    assert run.wait(timeout=300) == nbtrain.RunState.SUCCEEDED, run.error
    return run


@pytest.fixture(autouse=True, scope="module")
def _each_module_deletes_its_runs(request: pytest.FixtureRequest):
    """A module leaves no run behind on the session cluster: it stops what still runs and deletes the rest.

    A run still going holds its workers and their CPUs, which a later test would wait for;
    an ended one keeps its history and checkpoints in the session's home until deleted.
    Runs started from notebook kernels count too; the reference run is the session's.
    """
    import _reference_run

    yield
    module_items = [item for item in request.session.items if item.module is request.module]
    if not _session_cluster or not any("cluster" in item.fixturenames for item in module_items):
        return  # a module of tests that never used the session cluster has nothing on it to delete
    from nbtrain._client.connecting import connection

    current = connection._current
    if current is None or current.address != _session_cluster[0] or not connection._ray_connected():
        return
    for info in nbtrain.runs():
        if info["name"] == _reference_run.NAME:
            continue
        run = nbtrain.attach(info["name"])
        if not run.state.is_terminal:
            run.stop()
        run.delete()


_session_cluster: list[str] = []  # the session cluster's address, once the `cluster` fixture made it


@pytest.fixture(autouse=True)
def _ship_test_code_by_value(request):
    """Workers cannot import tests/ modules, so send their functions by value (as for a notebook)."""
    import _train_fns

    cloudpickle.register_pickle_by_value(request.module)
    cloudpickle.register_pickle_by_value(_train_fns)
    yield
