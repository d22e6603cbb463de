"""``connect()`` warming the first run's ranks, decided where it is decided, with named fakes around it:
on the embedded cluster only, once per new session, never when turned off (``warm=False``,
``$NBTRAIN_WARM_START=0``), as many as the default run takes and the cluster holds, said on the connection's
line, with an idle process for the first launch's supervisor, started as supervisors are; the warm pool counts
two prestarts at once (``connect()``'s, then a launch's) once; a run has Ray start a process for the next
supervisor once, as its ranks pass their first step or as its workers come back; and a launch whose supervisor
ran its (short, warm) run to the end and exited before the notebook asked it anything is that finished run.

That the warmed ranks are real processes a first launch takes: ``test_warm_workers.py``; what it gains:
``benchmarks/run_benchmarks.py`` (the just-started cluster's row)."""

from __future__ import annotations

import dataclasses
import threading
import types
from typing import Any

import pytest

from nbtrain._client import warm
from nbtrain._client.entry import connect as entry
from nbtrain._client.local import warm_processes
from nbtrain._cluster.launch_phases import FIRST_STEP, LaunchPhases
from nbtrain._cluster.warm import spare_process, warm_pool
from nbtrain._cluster.warm.spare_process import supervisor_runtime_env
from nbtrain._cluster.warm.warm_pool import WarmPool, shape_of
from nbtrain._options import RunOptions

pytestmark = pytest.mark.quick


class FakeCluster:
    def __init__(self, kind: str, cpus: float = 2.0) -> None:
        self.kind, self.cpus = kind, cpus

    def resources(self) -> dict[str, tuple[float, float]]:
        return {"CPU": (0.0, self.cpus)}


class FakeConnection:
    """The connection module as ``connect()`` uses it: the session before, and the one ``connect`` opens."""

    def __init__(self, before: Any, after: Any) -> None:
        self.before, self.after = before, after

    def session_now(self) -> Any:
        return self.before

    def connect(self, *args: Any, progress: Any, **kwargs: Any) -> Any:
        progress("Connected to 127.0.0.1:6379 as a Ray driver in 1.6 s")
        return self.after


@pytest.fixture
def warmed(monkeypatch) -> list[float]:
    """The CPUs ``warm_at_start`` was asked to warm for, once per call (nothing reaches a cluster)."""
    calls: list[float] = []

    def fake_warm_at_start(cpus: float, idle_s: float | None = None) -> tuple[int, RunOptions]:
        calls.append(cpus)
        return 2, RunOptions()

    monkeypatch.setattr(entry.warm_pool, "warm_at_start", fake_warm_at_start)
    monkeypatch.delenv(warm.WARM_START_ENV, raising=False)
    return calls


def _connect(monkeypatch, before: Any, after: Any, **kwargs: Any) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(entry, "connection", FakeConnection(before, after))
    entry.connect(progress=said.append, **kwargs)
    return said


def test_a_new_session_on_the_embedded_cluster_warms_the_first_runs_ranks_and_says_so(monkeypatch, warmed):
    said = _connect(monkeypatch, None, FakeCluster("local", cpus=2.0))
    assert warmed == [2.0]
    assert said[-1].startswith("Connected to 127.0.0.1:6379 as a Ray driver in 1.6 s; warming 2 ranks (1 CPU each)")
    assert "connect(warm=False)" in said[-1], "the line says how to turn it off"


def test_no_warming_on_a_remote_cluster_when_turned_off_or_when_the_session_was_already_open(monkeypatch, warmed):
    said = _connect(monkeypatch, None, FakeCluster("remote"))
    assert said == ["Connected to 127.0.0.1:6379 as a Ray driver in 1.6 s"], "the line is the connection's alone"
    _connect(monkeypatch, None, FakeCluster("local"), warm=False)
    same = FakeCluster("local")
    _connect(monkeypatch, same, same)  # connect() again: the session it had
    monkeypatch.setenv(warm.WARM_START_ENV, "0")  # nbtrain lab --no-warm, for every kernel
    _connect(monkeypatch, None, FakeCluster("local"))
    assert warmed == []


@pytest.mark.parametrize(("value", "wanted"), [("0", False), ("off", False), ("false", False), ("1", True),
                                               ("", True)])
def test_the_environment_turns_warming_off_for_every_kernel(monkeypatch, value, wanted):
    monkeypatch.setenv(warm.WARM_START_ENV, value)
    assert warm.warm_start_wanted(True) is wanted
    assert warm.warm_start_wanted(False) is False


def test_as_many_ranks_as_the_default_run_takes_and_the_cluster_holds(monkeypatch):
    asked: list[tuple[Any, int | None]] = []
    monkeypatch.setattr(warm, "pool_for_launch", lambda: "pool")
    monkeypatch.setattr(warm, "prestart", lambda pool, options, workers=None: asked.append((options, workers)))
    assert warm.warm_at_start(8.0)[0] == 2, "the default run has 2 ranks"
    assert warm.warm_at_start(1.0)[0] == 1, "a 1-CPU cluster holds one"
    assert warm.warm_at_start(0.5)[0] == 0 and len(asked) == 2, "none fits: nothing is started"
    assert all(shape_of(options) == shape_of(RunOptions()) for options, _ in asked)
    warm.warm_at_start(2.0, 30.0)
    assert asked[-1][0].warm_idle_s == 30.0, "connect(warm_idle_s=30) sets how long they wait"


@pytest.mark.parametrize(("title", "environ", "kind"), [
    ("ray::TrainWorker", {}, "rank"),                      # idle, kept for the next run
    ("ray::TrainWorker.__init__", {}, "rank"),             # warming
    ("ray::TrainWorker.run", {}, None),                    # training: not warm, a run's
    ("ray::IDLE", {"NBTRAIN_PROCESS": "run supervisor"}, "supervisor"),  # the next supervisor's spare
    ("ray::IDLE", {}, None),                               # Ray's own idle process
    ("ray::nbtrain-run:x:RunSupervisor", {"NBTRAIN_PROCESS": "run supervisor"}, None),  # a run's supervisor
])
def test_cluster_status_tells_warm_processes_from_a_runs(title, environ, kind):
    assert warm_processes.kind_of(title, environ) == kind


def test_cluster_status_says_what_the_warm_processes_hold():
    line = warm_processes.describe([warm_processes.WarmProcess("rank", 1, 700 * 2**20),
                                    warm_processes.WarmProcess("rank", 2, 700 * 2**20),
                                    warm_processes.WarmProcess("supervisor", 3, 90 * 2**20)])
    assert line.startswith("warm: 2 idle rank processes (1.4 GB), 1 spare supervisor process (90 MB); they exit "
                           "after warm_idle_s"), line
    assert "nbtrain.release_warm()" in line


class PoolWithoutRay(WarmPool):
    """The pool's prestart with the cluster around it faked: one live node, and workers recorded, not started.
    ``first_nodes_call`` runs inside the first prestart's look at the nodes (where a second one could slip in)."""

    def __init__(self) -> None:  # no watch thread, no anchor
        self._workers, self._closing = [], False
        self._lock, self._prestarting = threading.Lock(), threading.Lock()
        self._spare_asked: set[str] = set()
        self.started: list[bool] = []
        self.first_nodes_call: Any = None

    def _start(self, shape, node_id, run_name, idle_s, background=False, for_launch=False):  # type: ignore[no-untyped-def]
        worker = warm_pool._Worker(handle=f"worker-{len(self.started)}", shape=shape, node_id=node_id, pid=0,
                                   leased_by=run_name, for_launch=for_launch)
        self.started.append(background)
        with self._lock:
            self._workers.append(worker)
        return worker


def test_two_prestarts_at_once_start_the_workers_once(monkeypatch):
    pool, shape = PoolWithoutRay(), shape_of(RunOptions())
    second = threading.Thread(target=pool.prestart, args=(shape, 2, 600.0, False))

    def nodes() -> list[dict[str, Any]]:
        if pool.first_nodes_call is not None:
            call, pool.first_nodes_call = pool.first_nodes_call, None
            call()
        return [{"Alive": True, "NodeID": "head"}]

    def launch_prestarts_meanwhile() -> None:
        second.start()
        second.join(timeout=0.5)  # it must wait for the first one: it is still running when this returns

    spares: list[float] = []
    pool.first_nodes_call = launch_prestarts_meanwhile
    monkeypatch.setattr(warm_pool.ray, "nodes", nodes)
    monkeypatch.setattr(warm_pool, "prestart_for_supervisors", spares.append)
    pool.prestart(shape, 2, 600.0, True)  # connect()'s, in the background
    second.join(timeout=30)
    assert pool.started == [True, True], "the launch's prestart found connect()'s two idle workers"
    assert spares == [600.0], ("connect()'s asks, on the cluster, for a process for the first launch's supervisor, "
                               "kept as long as the ranks; a launch's own prestart does not")


@dataclasses.dataclass(frozen=True)
class IdleHandle:
    """A worker's handle as the pool's give_back uses it: ``tidy.remote()`` is asked, and does nothing here."""

    name: str

    @property
    def tidy(self) -> Any:
        return types.SimpleNamespace(remote=lambda: None)


@pytest.fixture
def pool_on_one_node(monkeypatch: pytest.MonkeyPatch) -> PoolWithoutRay:
    """A pool on a one-node cluster whose every worker answers; no spare supervisor process is asked for."""
    monkeypatch.setattr(warm_pool.ray, "nodes", lambda: [{"Alive": True, "NodeID": "head"}])
    monkeypatch.setattr(warm_pool, "prestart_for_supervisors", lambda idle_s: None)
    monkeypatch.setattr(PoolWithoutRay, "_alive", lambda self, workers: workers)
    return PoolWithoutRay()


@pytest.mark.parametrize("warmed_at_connect", [True, False])
def test_a_launch_counts_as_warm_only_the_workers_started_before_it_asked(monkeypatch, pool_on_one_node,
                                                                           warmed_at_connect):
    pool, shape = pool_on_one_node, shape_of(RunOptions())
    if warmed_at_connect:
        pool.prestart(shape, 2, 600.0, True)    # connect()'s, in the background
    pool.prestart(shape, 2, 600.0, False)       # the launch's own, a moment before its lease
    _, warm = pool.lease("first-run", shape, [("head", None)] * 2, 600.0)
    assert warm == ([0, 1] if warmed_at_connect else []), "NBTRAIN_WARM_START=0: the first launch's ranks start cold"
    monkeypatch.setattr(warm_pool, "actor_key", lambda handle: handle)
    for worker in pool._workers:
        worker.handle = IdleHandle(worker.handle)
    pool.give_back("first-run", [worker.handle for worker in pool._workers])
    assert [w.leased_by for w in pool._workers] == [None, None]
    pool.prestart(shape, 2, 600.0, False)
    assert pool.lease("second-run", shape, [("head", None)] * 2, 600.0)[1] == [0, 1], "a re-run's ranks are warm"


def test_workers_started_for_a_launch_that_did_not_take_them_are_warm_for_the_next(pool_on_one_node):
    pool, shape = pool_on_one_node, shape_of(RunOptions())
    pool.prestart(shape, 2, 600.0, False)   # a launch refused after its prestart (a live run's name): no lease
    pool.prestart(shape, 2, 600.0, False)   # the fixed cell, run again
    assert pool.started == [False, False], "the second launch starts none: the first one's are idle"
    assert pool.lease("fixed-run", shape, [("head", None)] * 2, 600.0)[1] == [0, 1]


def test_a_spare_process_is_started_as_a_supervisor_is_and_imports_its_module():
    """A supervisor takes only a process of its own runtime env (so supervisor_options and the spares read one
    declaration), and the setup hook it names exists (Ray ends a process whose hook fails)."""
    from nbtrain._cluster.supervisor import supervisor

    assert supervisor.supervisor_options("a-run")["runtime_env"] == supervisor_runtime_env()
    module, _, function = spare_process.SUPERVISOR_SETUP_HOOK.rpartition(".")
    assert module == supervisor.__name__ and callable(getattr(supervisor, function))


def test_a_process_for_the_next_supervisor_is_asked_once_per_run_at_its_first_step_or_as_it_ends(monkeypatch):
    asked: list[float] = []
    monkeypatch.setattr(warm_pool, "prestart_for_supervisors", asked.append)
    pool = PoolWithoutRay()
    pool.spare_for_next_supervisor("long-run", 600.0)   # its supervisor saw the first step
    pool.spare_for_next_supervisor("long-run", 600.0)   # (a restarted supervisor asks again)
    pool.give_back("long-run", [])                       # its workers come back: asked already
    assert asked == [600.0]
    pool._workers.append(warm_pool._Worker("w", shape_of(RunOptions()), "head", pid=1, leased_by="short-run",
                                           idle_s=30.0))
    pool.give_back("short-run", [])                      # ended before its first step was seen
    assert asked == [600.0, 30.0]


SUPERVISOR_ENV = {"NBTRAIN_PROCESS": "run supervisor", "RAY_JOB_ID": "01000000"}


@pytest.mark.parametrize(("title", "environ", "unused"), [
    ("ray::IDLE", SUPERVISOR_ENV, True),                                             # asked for, idle
    ("/usr/bin/python3 .../setup_worker.py .../default_worker.py", SUPERVISOR_ENV, True),  # still starting
    ("ray::nbtrain-run:x:RunSupervisor.poll", SUPERVISOR_ENV, False),                # a supervisor took it
    ("ray::IDLE", {**SUPERVISOR_ENV, "RAY_JOB_ID": "02000000"}, False),              # another session's
    ("ray::IDLE", {"RAY_JOB_ID": "01000000"}, False),                                # Ray's own idle process
])
def test_a_spare_is_asked_for_only_when_none_asked_before_is_left(title, environ, unused):
    """Ray starts a process for every ask; a run that ends with no launch after it would leave one more idle."""
    assert spare_process.has_unused_spare([(title, environ)], "01000000") is unused
    assert spare_process.has_unused_spare([], "01000000") is False


def test_the_first_step_is_known_once_every_rank_of_the_first_attempt_reported():
    phases = LaunchPhases(launch_called=1.0, supervisor_up=2.0)
    phases.ranks_assigned(attempt=0, world_size=2, warm_ranks=2, at=3.0)
    phases.rank_reached(0, 0, {FIRST_STEP: 4.0})
    assert not phases.first_step.is_set(), "one rank of two"
    phases.rank_reached(1, 1, {FIRST_STEP: 4.5})
    assert not phases.first_step.is_set(), "another attempt's report does not count"
    phases.rank_reached(1, 0, {FIRST_STEP: 5.0})
    assert phases.first_step.is_set()


class GoneSupervisor:
    """A supervisor's handle whose actor is gone, without a constructor error (it exited, or was killed)."""

    class summary:
        @staticmethod
        def remote() -> None:
            return None  # what ray.get is given: the test's ray.get raises as for a dead actor


def test_a_supervisor_gone_at_once_is_a_finished_run_when_its_files_say_so(monkeypatch):
    """A warm launch of a short function can run to its end, and its supervisor exit, before the notebook's
    first question reaches it: that run is read from its files, not refused."""
    import ray

    from nbtrain._client.launching import checks
    from nbtrain._exceptions import NbtrainError

    def gone(*_args: Any, **_kwargs: Any) -> Any:
        raise ray.exceptions.RayActorError()

    killed: list[Any] = []
    monkeypatch.setattr(ray, "get", gone)
    monkeypatch.setattr(ray, "kill", lambda handle, no_restart: killed.append(handle))
    checks.wait_for_supervisor(GoneSupervisor(), "short-run", ended=lambda: True)
    assert killed == []
    with pytest.raises(NbtrainError, match="'short-run' could not start its supervisor"):
        checks.wait_for_supervisor(GoneSupervisor(), "short-run", ended=lambda: False)
