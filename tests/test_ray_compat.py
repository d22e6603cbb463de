"""Ray's private and internal APIs are used in one module, ``nbtrain/_ray_compat.py``, and a probe of them that
fails never fails a run: it says why, once.

The walk reads every module but the compatibility module with ``ast`` and names file:line for an
import of Ray's internals, a private name reached from ``ray`` (``ray._private.state``), a private
attribute of a Ray object nbtrain once read (``handle._actor_id``, ``worker.gcs_client``), or
``ray.init``'s private ``_metadata=``. None of these tests starts Ray.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import pytest

import nbtrain._ray_compat as compat

pytestmark = pytest.mark.quick

PACKAGE = Path(__file__).resolve().parent.parent / "nbtrain"
COMPAT = PACKAGE / "_ray_compat.py"
INTERNAL_MODULES = ("ray._private", "ray._raylet", "ray.train.v2._internal", "ray.core.generated",
                    "ray.experimental.internal_kv")
PRIVATE_ATTRIBUTES = {"_actor_id", "gcs_client", "global_worker"}  # of Ray objects, whatever their name here
PRIVATE_KEYWORDS = {"_metadata"}  # ray.init(address, _metadata=...)
NOTICE = {"say_once", "reason"}  # how a fallback says it was taken: no Ray internal of their own


def _internal(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in INTERNAL_MODULES)


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``ray`` in ``ray._private.state.jobs``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations(source: str, filename: str) -> list[str]:
    """Each use of a Ray internal in ``source``, as ``filename:line: what``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.Import):
            what = next((f"imports {a.name}" for a in node.names if _internal(a.name)), None)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            what = next((f"imports {name}" for name in names if _internal(name)), None)
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES:
                what = f"reads .{node.attr}"
            elif _private(node.attr) and _root(node) == "ray":
                what = f"reads ray...{node.attr}"
        elif isinstance(node, ast.Call):
            what = next((f"passes {k.arg}=" for k in node.keywords if k.arg in PRIVATE_KEYWORDS), None)
        if what:
            found.append(f"{filename}:{node.lineno}: {what}")
    return found


def test_nothing_outside_the_compat_module_uses_a_ray_internal():
    modules = [path for path in PACKAGE.rglob("*.py") if path != COMPAT]
    assert len(modules) > 80, "the walk found too few modules"
    found = [v for path in sorted(modules)
             for v in violations(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert found == [], "move these into nbtrain/_ray_compat.py (one entry each):\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "import ray._private.node",
    "from ray._raylet import AuthenticationMode",
    "from ray._private import auto_init_hook",
    "from ray.core.generated import gcs_pb2",
    "from ray.experimental.internal_kv import _internal_kv_get",
    "from ray.train.v2._internal.execution.train_fn_utils import TrainFnUtils",
    "jobs = ray._private.state.jobs()",
    "same = a._actor_id == b._actor_id",
    "gcs = worker.gcs_client",
    "ray.init(address, _metadata=[('authorization', 'Bearer x')])",
])
def test_the_walk_finds_each_kind_of_use(line):
    found = violations(line, "example.py")
    assert found and all(v.startswith("example.py:1: ") for v in found), (line, found)


def test_public_ray_passes_the_walk():
    source = "import ray\nfrom ray.util.state import list_jobs\nray.init(address, namespace='x')\nh.__eq__(g)\n"
    assert violations(source, "example.py") == []


def test_the_compat_docstring_lists_every_entry():
    doc = compat.__doc__ or ""
    missing = [name for name in compat.__all__ if name not in NOTICE and f"``{name}``" not in doc]
    assert missing == [], f"add these to nbtrain/_ray_compat.py's list: {missing}"


def test_every_entry_says_what_it_prefers_and_what_degrades():
    for name in compat.__all__:
        # Ray Train's seam is read on first use; its entry is the module's __getattr__
        entry = compat.__getattr__ if name in compat._RAY_TRAIN_SEAM else getattr(compat, name)
        if isinstance(entry, types.FunctionType) and name not in NOTICE:
            doc = entry.__doc__ or ""
            assert "Public instead" in doc or "as for" in doc, f"{name}: which public API does it prefer?"
            assert "Degrades" in doc, f"{name}: what degrades when it fails?"


def _fail(*_: object) -> frozenset[str]:
    raise AttributeError("'GcsNodeInfo' object has no attribute 'state_snapshot'")


def test_draining_nodes_that_cannot_be_read_are_none_and_say_why(monkeypatch):
    monkeypatch.setattr(compat, "_draining_from_node_table", _fail)
    monkeypatch.setattr(compat, "_draining_from_autoscaler_status", _fail)
    draining = compat.draining_nodes()
    assert draining.nodes == frozenset()
    assert "state_snapshot" in draining.unreadable


def test_draining_nodes_fall_back_to_the_autoscaler_status(monkeypatch):
    monkeypatch.setattr(compat, "_draining_from_node_table", _fail)
    monkeypatch.setattr(compat, "_draining_from_autoscaler_status", lambda: frozenset({"abc123"}))
    assert compat.draining_nodes() == compat.Draining(frozenset({"abc123"}))


class _Feed:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, kind: str, message: str, attempt: int) -> None:
        self.events.append((kind, message))


class _Table:
    def snapshot(self) -> list[dict[str, object]]:
        return [{"rank": 0, "node_id": "n1", "node": "n1"}, {"rank": 1, "node_id": "n2", "node": "n2"}]


def test_an_elastic_run_that_cannot_read_node_state_keeps_its_size_and_says_so_once(monkeypatch):
    from nbtrain._cluster.elastic import policy
    from nbtrain._cluster.elastic.sizing import GrowthWatch
    from nbtrain._options import RunOptions

    monkeypatch.setattr(policy, "draining_nodes", lambda: compat.Draining(frozenset(), "RpcError: gone"))
    options, feed = RunOptions(workers=(1, 2)), _Feed()
    elastic = policy.ElasticPolicy(options, policy.RayCluster(), lambda kind, message: feed.event(kind, message, 1))
    growth = GrowthWatch(options, 2)  # the parts _drain_check reads, no Ray
    for _ in range(3):
        elastic._next_drain_look = 0.0
        elastic._drain_check(growth, None, _Table())
    assert growth.target is None, "the run keeps its size"
    assert [kind for kind, _ in feed.events] == ["resize"]
    assert "cannot read which nodes Ray is draining (RpcError: gone)" in feed.events[0][1]


@pytest.mark.quick
def test_serves_shutdown_notice_stays_out_of_the_cell_and_every_other_notice_is_printed(monkeypatch):
    """``serve.shutdown()`` made Ray print "(raylet) Task ServeController.graceful_shutdown failed…" into the
    user's cell though Serve shut down as asked (07_serve's page showed it); any other notice still reaches it."""
    from ray._private import worker

    printed = []
    monkeypatch.setattr(worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data["lines"]))
    compat.quiet_shutdown_notices()
    compat.quiet_shutdown_notices()  # wrapped once, however often a kernel connects
    serve = ("Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the task "
             "will be retried. Error: The actor is dead because it was killed by `ray.kill`.")
    worker.print_to_stdstream({"lines": [serve], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    other = "Task Trainer.fit failed. There are infinite retries remaining, so the task will be retried."
    worker.print_to_stdstream({"lines": [other], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    worker.print_to_stdstream({"lines": [serve], "pid": 4242, "is_err": False}, ignore_prefix=False)
    many = ("WARNING: 16 PYTHON worker processes have been started on node: 4444a0 with address: 127.0.0.1, which "
            "is 4x the maximum expected startup concurrency (2). This could be a result of using a large number of "
            "actors, tasks blocked in ray.get() calls, or tasks with fractional CPU requests")
    worker.print_to_stdstream({"lines": [many], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printed == [[other], [serve]], "warm and spare processes by design are not the user's to act on"


@pytest.mark.quick
def test_rays_notice_of_a_ranks_death_stays_out_of_the_cell_once_the_kernel_has_seen_that_rank(monkeypatch):
    """05_fault_tolerance kills a rank: the run says so in its own words, naming the rank, and Ray's notice of the
    same death ("(raylet) A worker died or was killed…") stayed out of the page only once the kernel knew the
    process as a rank (from a summary); a death of any other process is printed as before."""
    from ray._private import worker

    printed = []
    monkeypatch.setattr(worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data["lines"]))
    monkeypatch.setattr(compat, "_rank_processes", set())
    compat.quiet_shutdown_notices()

    def death(pid: int, ip: str = "127.0.0.1") -> str:
        return ("A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
                "the problem, check the logs for the dead worker. Lease ID: 1b00 Worker ID: d41b Node ID: d726 "
                f"Worker IP address: {ip} Worker port: 36687 Worker PID: {pid} Worker exit type: SYSTEM_ERROR")

    compat.note_rank_processes([{"rank": 0, "pid": 18994, "node": "127.0.0.1"},
                                {"rank": 1, "pid": 18995, "node": "127.0.0.1"}, {"rank": 2, "pid": None}])
    for line in (death(18995), death(4242), death(18995, ip="10.0.0.7")):
        worker.print_to_stdstream({"lines": [line], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printed == [[death(4242)], [death(18995, ip="10.0.0.7")]]


def test_a_head_without_the_dashboard_starts_no_api_server_and_one_with_it_does(monkeypatch):
    import ray._private.node

    started: list[bool | None] = []
    monkeypatch.setattr(ray._private.node.Node, "start_api_server",
                        lambda node, *, include_dashboard, raise_on_failure: started.append(include_dashboard))
    compat.no_api_server_without_dashboard()
    for include_dashboard in (False, None, True):
        ray._private.node.Node.start_api_server(object(), include_dashboard=include_dashboard, raise_on_failure=False)
    assert started == [None, True], "--include-dashboard=false: none; Ray's default or the dashboard: Ray's own"


def test_a_process_readied_ahead_has_rays_serialization_context_before_any_task():
    """What a spare process for the next supervisor does while it waits (see spare_process): the context that
    Ray otherwise builds on a new actor's first arguments exists already, and Ray carries it over to the job."""
    script = ("import ray._private.worker as w, nbtrain._ray_compat as c; c.ready_to_deserialize(); "
              "print(len(w.global_worker.serialization_context_map))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "1", done.stderr
