"""The nbtrain server extension's REST API, against a real JupyterLab server.

The registry records are written by nbtrain's own writers (``record_launch``,
``record_connection``), as ``launch()`` and ``connect()`` write them. The
agent is swapped for a small script (``_fake_agent.py``, through the
``NbtrainServer`` settings) that answers from files the test writes, meaning
"what the cluster says", and records how it was called. Sweeps exist only on
a cluster: their test runs a real one on the session's loopback cluster and
reads it through the real ``python -m nbtrain agent``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nbtrain
from nbtrain._lab.run_list import ClusterAnswers, served_runs, served_sweeps
from nbtrain._registry import record_connection, record_from_summary, record_launch

from _jupyterlab import REPO, JupyterLab, start_jupyterlab

FAKE_AGENT = Path(__file__).with_name("_fake_agent.py")
STALE_AFTER = 3.0
_ports = itertools.count(20001)


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def start_lab(tmp_path_factory: pytest.TempPathFactory, home: Path, **settings: Any) -> JupyterLab:
    return start_jupyterlab(
        tmp_path_factory.mktemp("root"),
        env={"NBTRAIN_HOME": str(home)},
        server_config={"NbtrainServer": {"agent_command": [sys.executable, str(FAKE_AGENT)], **settings}},
        labextension=False,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nbtrain-home")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Iterator[JupyterLab]:
    server = start_lab(tmp_path_factory, home, refresh_interval=0.5, refresh_max_backoff=4.0,
                       stale_after=STALE_AFTER)
    yield server
    server.stop()


class FakeCluster:
    """What the fake agent's clusters say (files under ``$NBTRAIN_HOME/fake-cluster``)."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "fake-cluster"
        self.said: dict[str, dict[str, Any]] = {}

    def says(self, name: str, address: str, state: str = "running", *, step: int = 0, **summary: Any) -> None:
        """The cluster at ``address`` reports run ``name`` (a supervisor summary, as the real CLI reads it)."""
        summary = {"name": name, "state": state, "started": time.time(), "ended": None, "world_size": 2,
                   "attempt": 1, "step": step, "total_steps": 100, "latest": {}, "error": None,
                   "owner": {"notebook": None}, **summary}
        self.said[name] = record_from_summary(summary, address)
        write_json(self.dir / f"{name}.json", self.said[name])

    def has_nodes(self, address: str, nodes: int, cpus: list[float]) -> None:
        path = self.dir / "clusters.json"
        clusters = json.loads(path.read_text()) if path.exists() else {}
        clusters[address] = {"nodes": nodes, "resources": {"CPU": cpus, "GPU": [0, 0]}}
        write_json(path, clusters)

    def goes_away(self, address: str) -> None:
        for path in self.dir.glob("*.json"):
            if path.name != "clusters.json" and json.loads(path.read_text())["address"] == address:
                path.unlink()

    def state(self, name: str) -> str:
        return json.loads((self.dir / f"{name}.json").read_text())["state"]


@pytest.fixture
def registry(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty registry for each test; nbtrain's registry writers write to it."""
    monkeypatch.setenv("NBTRAIN_HOME", str(home))
    for path in [*home.glob("runs/*"), *home.glob("fake-cluster/*"), home / "cluster.json", home / "calls.jsonl"]:
        path.unlink(missing_ok=True)
    yield home


@pytest.fixture
def fake_cluster(registry: Path, lab: JupyterLab) -> Iterator[FakeCluster]:
    """The fake clusters; afterwards every run they reported ends, so no later test sees it live."""
    fake = FakeCluster(registry)
    yield fake
    for name, run in fake.said.items():
        write_json(fake.dir / f"{name}.json", {**run, "state": "stopped"})
    wait_for(lambda: all(run["terminal"] for run in lab.request("GET", "nbtrain/api/runs")[1]["runs"]
                         if run["name"] in fake.said),
             what="the test's runs to end on the fake cluster")


@pytest.fixture
def address() -> str:
    """A cluster address no other test uses (the server remembers every cluster's last answer)."""
    return f"ray://127.0.0.1:{next(_ports)}"


def launch(name: str, address: str, *, notebook: str | None = None) -> None:
    """What ``launch()`` records, once per launch."""
    record_launch(name, address, notebook=notebook, workers=2, total_steps=100)


def runs(lab: JupyterLab) -> dict[str, dict[str, Any]]:
    status, body = lab.request("GET", "nbtrain/api/runs")
    assert status == 200, body
    return {run["name"]: run for run in body["runs"]}


def run_shows(lab: JupyterLab, name: str, **expected: Any) -> Callable[[], dict[str, Any] | None]:
    """A condition for ``wait_for``: the listed run ``name`` has the ``expected`` fields."""
    def check() -> dict[str, Any] | None:
        run = runs(lab).get(name)
        return run if run is not None and all(run.get(k) == v for k, v in expected.items()) else None
    return check


def agent_calls(home: Path) -> list[dict[str, Any]]:
    """Every call the fake agent got: time, argv and the agent's pid."""
    path = home / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def calls(home: Path, since: float = 0.0) -> list[list[str]]:
    return [call["argv"] for call in agent_calls(home) if call["time"] >= since]


def refreshes(home: Path, address: str, since: float = 0.0) -> int:
    return calls(home, since).count(["runs", "--json", "--address", address])


ROUTES = [
    ("GET", "nbtrain/api/runs", 200),
    ("GET", "nbtrain/api/runs/alpha", 200),
    ("GET", "nbtrain/api/cluster", 200),
    ("POST", "nbtrain/api/runs/alpha/stop", 202),
]


@pytest.mark.parametrize(("method", "path", "ok"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_needs_the_token(lab: JupyterLab, registry: Path, address: str, method: str, path: str,
                                     ok: int) -> None:
    launch("alpha", address)
    assert lab.request(method, path, token=False)[0] == 403
    assert lab.request(method, path + f"?token=wrong{lab.token}", token=False)[0] == 403
    status, body = lab.request(method, path)
    assert status == ok, body


def test_registry_runs_show_what_their_cluster_says_live_first(lab: JupyterLab, fake_cluster: FakeCluster,
                                                               address: str) -> None:
    for name in ("old", "older-live", "new"):
        launch(name, address, notebook=f"{name}.ipynb")
        time.sleep(0.01)  # launched one after the other: distinct creation times
    (fake_cluster.dir.parent / "runs" / "broken.json").write_text('{"name": "brok')
    (fake_cluster.dir.parent / "runs" / ".new.json.1234.tmp").write_text("{}")

    listed = runs(lab)  # before the cluster answers: what launch() recorded
    assert [listed[name]["state"] for name in ("old", "older-live", "new")] == ["pending"] * 3
    assert "broken" not in listed

    fake_cluster.says("old", address, "succeeded", step=100, ended=time.time(), latest={"loss": 0.1})
    fake_cluster.says("older-live", address, "running", step=5)
    fake_cluster.says("new", address, "running", step=40, latest={"loss": 0.5, "accuracy": 0.75})
    new = wait_for(run_shows(lab, "new", state="running"), what="the cluster's state to be shown")

    body = lab.request("GET", "nbtrain/api/runs")[1]
    ours = [run for run in body["runs"] if run["address"] == address]
    assert [run["name"] for run in ours] == ["new", "older-live", "old"]
    assert [run["terminal"] for run in ours] == [False, False, True]
    assert abs(body["now"] - time.time()) < 5
    assert new["progress"] == {"step": 40, "total_steps": 100, "fraction": 0.4}
    assert new["latest"] == {"loss": 0.5, "accuracy": 0.75}
    assert new["notebook"] == "new.ipynb"  # identity from the registry; the cluster did not know it
    assert new["stale"] is False
    assert new["stop"] is None
    assert ours[2]["state"] == "succeeded" and ours[2]["latest"] == {"loss": 0.1}


def test_runs_launched_elsewhere_are_listed_too(lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    record_connection(address, "local")
    fake_cluster.says("elsewhere", address, "running", step=3, owner={"notebook": "their.ipynb"})

    run = wait_for(run_shows(lab, "elsewhere", state="running"), what="the other machine's run to be listed")
    assert run["address"] == address
    assert run["notebook"] == "their.ipynb"

    fake_cluster.says("elsewhere", address, "succeeded", step=100, ended=time.time())
    run = wait_for(run_shows(lab, "elsewhere", state="succeeded"), what="it to finish")
    assert run["terminal"] is True


def test_a_run_whose_cluster_goes_away_stays_listed_and_turns_stale(lab: JupyterLab, fake_cluster: FakeCluster,
                                                                    address: str) -> None:
    launch("drifting", address)
    fake_cluster.says("drifting", address, "running", step=7)
    wait_for(run_shows(lab, "drifting", state="running", stale=False), what="the cluster's answer")

    fake_cluster.goes_away(address)

    run = wait_for(run_shows(lab, "drifting", stale=True), timeout=STALE_AFTER + 15, what="the run to turn stale")
    assert run["state"] == "running"  # the last state known
    assert run["progress"]["step"] == 7
    assert run["terminal"] is False


def test_get_one_run(lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    launch("alpha", address)
    fake_cluster.says("alpha", address, latest={"loss": 0.25, "accuracy": 0.9})
    run = wait_for(run_shows(lab, "alpha", state="running"))

    status, one = lab.request("GET", "nbtrain/api/runs/alpha")
    assert status == 200
    assert one["latest"] == {"loss": 0.25, "accuracy": 0.9}
    assert one.keys() == run.keys()

    status, body = lab.request("GET", "nbtrain/api/runs/missing")
    assert status == 404
    assert "missing" in body["message"]
    assert lab.request("GET", "nbtrain/api/runs/..%2Fcluster")[0] == 404


def test_stop_runs_nbtrain_stop_and_the_list_shows_it(lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    launch("alpha", address)
    fake_cluster.says("alpha", address)
    wait_for(run_shows(lab, "alpha", state="running"))

    status, run = lab.request("POST", "nbtrain/api/runs/alpha/stop")

    assert status == 202
    assert run["stop"]["status"] == "stopping"
    stopped = wait_for(run_shows(lab, "alpha", state="stopped"), what="the run to be shown stopped")
    assert stopped["stop"] is None  # the cluster says it ended; nothing pending
    assert stopped["terminal"] is True
    assert fake_cluster.state("alpha") == "stopped"
    assert ["stop", "alpha", "--address", address] in calls(fake_cluster.dir.parent)


def test_pause_and_resume_run_the_tool_and_answer_with_the_run(lab: JupyterLab, fake_cluster: FakeCluster,
                                                                address: str) -> None:
    launch("paused", address)
    fake_cluster.says("paused", address)
    wait_for(run_shows(lab, "paused", state="running"))

    status, run = lab.request("POST", "nbtrain/api/runs/paused/pause")
    assert (status, run["paused_at"]) == (200, 7)
    status, refused = lab.request("POST", "nbtrain/api/runs/paused/pause")
    assert status == 409 and "cannot be paused: it is paused" in refused["message"]
    status, run = lab.request("POST", "nbtrain/api/runs/paused/resume")
    assert (status, run["paused_at"]) == (200, None)
    assert ["pause", "paused", "--address", address] in calls(fake_cluster.dir.parent)
    assert ["resume", "paused", "--address", address] in calls(fake_cluster.dir.parent)


def test_stop_failure_shows_the_tools_message(lab: JupyterLab, registry: Path, address: str) -> None:
    launch("far", address)  # nothing answers at its address

    assert lab.request("POST", "nbtrain/api/runs/far/stop")[0] == 202

    run = wait_for(lambda: (r := runs(lab)["far"])["stop"]["status"] == "failed" and r, what="the stop to fail")
    assert f"Nothing is listening at {address}" in run["stop"]["message"]
    assert run["state"] == "pending"
    assert run["terminal"] is False


def test_a_run_without_an_address_is_not_stopped_on_some_other_cluster(lab: JupyterLab, registry: Path) -> None:
    record = {"name": "nowhere", "state": "running", "created": time.time(), "updated": time.time()}
    write_json(registry / "runs" / "nowhere.json", record)  # written by hand, or by an older nbtrain

    assert (answer := lab.request("POST", "nbtrain/api/runs/nowhere/stop"))[0] == 202, answer

    run = wait_for(lambda: (r := runs(lab)["nowhere"])["stop"]["status"] == "failed" and r, what="the stop to fail")
    assert "does not say which cluster" in run["stop"]["message"]
    assert not [call for call in calls(registry) if call[0] == "stop"]


def test_stop_of_an_ended_run_is_a_conflict(lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    launch("done", address)
    fake_cluster.says("done", address, "succeeded", ended=time.time())
    wait_for(run_shows(lab, "done", state="succeeded"))
    start = time.time()

    status, body = lab.request("POST", "nbtrain/api/runs/done/stop")

    assert status == 409
    assert "already ended" in body["message"]
    assert lab.request("POST", "nbtrain/api/runs/missing/stop")[0] == 404
    assert not [call for call in calls(fake_cluster.dir.parent, since=start) if call[0] == "stop"]


def test_one_agent_serves_every_command_and_a_dead_one_is_replaced(lab: JupyterLab, fake_cluster: FakeCluster,
                                                                   address: str) -> None:
    home = fake_cluster.dir.parent
    for name in ("first", "second", "crash", "third"):
        launch(name, address)
        fake_cluster.says(name, address)
    wait_for(run_shows(lab, "third", state="running"))
    pids = []
    for name in ("first", "second"):
        assert lab.request("POST", f"nbtrain/api/runs/{name}/stop")[0] == 202
        wait_for(run_shows(lab, name, state="stopped"), what=name)
        pids.append(wait_for(lambda n=name: [c["pid"] for c in agent_calls(home) if c["argv"][:2] == ["stop", n]]))
    assert pids[0] == pids[1], "each stop started its own agent"

    assert lab.request("POST", "nbtrain/api/runs/crash/stop")[0] == 202
    crashed = wait_for(lambda: (r := runs(lab)["crash"])["stop"]["status"] == "failed" and r,
                       what="the stop to fail with the agent")
    assert "agent exited unexpectedly" in crashed["stop"]["message"]
    assert "segmentation fault" in crashed["stop"]["message"]

    assert lab.request("POST", "nbtrain/api/runs/third/stop")[0] == 202
    wait_for(run_shows(lab, "third", state="stopped"), what="a new agent to stop it")
    third = [c["pid"] for c in agent_calls(home) if c["argv"][:2] == ["stop", "third"]]
    assert third and third[0] != pids[0]


def test_no_refresh_for_the_cluster_of_ended_runs(lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    launch("done", address)
    fake_cluster.says("done", address, "failed", error="Rank 1 raised ValueError: boom\nTraceback ...")
    done = wait_for(run_shows(lab, "done", state="failed"), what="the cluster to say it failed")
    assert done["error"] == "Rank 1 raised ValueError: boom"
    live = f"ray://127.0.0.1:{next(_ports)}"
    launch("live", live)
    fake_cluster.says("live", live)
    start = time.time()

    wait_for(lambda: refreshes(fake_cluster.dir.parent, live, since=start) >= 3, what="three refreshes of the live run")

    assert refreshes(fake_cluster.dir.parent, address, since=start) == 0


def test_an_unreachable_cluster_is_asked_less_often(lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    home = fake_cluster.dir.parent
    launch("lost", address)  # nothing answers there
    reachable = f"ray://127.0.0.1:{next(_ports)}"
    launch("fine", reachable)
    fake_cluster.says("fine", reachable)
    start = time.time()

    wait_for(lambda: refreshes(home, reachable, since=start) >= 10, timeout=30,
             what="ten refreshes of the live cluster")

    # Every 0.5 s for the reachable cluster; after 0.5, 1, 2 and 4 s for the other.
    assert 1 <= refreshes(home, address, since=start) <= 5


def test_cluster_is_the_last_connected_one_with_what_it_says(lab: JupyterLab, fake_cluster: FakeCluster,
                                                            address: str) -> None:
    assert lab.request("GET", "nbtrain/api/cluster") == (200, {"cluster": None})
    record_connection(address, "local")
    fake_cluster.has_nodes(address, 2, [1, 6])
    runs(lab)  # a browser watches; no run is live, so the connected cluster is refreshed

    shown = wait_for(lambda: (c := lab.request("GET", "nbtrain/api/cluster")[1]["cluster"])["nodes"] == 2 and c,
                     what="the cluster's answer")
    assert shown["address"] == address
    assert shown["kind"] == "local"  # from the registry (the agent only knows the address it was given)
    assert shown["resources"] == {"CPU": [1, 6], "GPU": [0, 0]}


def test_the_cluster_line_shows_what_its_cluster_answers_while_another_is_silent(
        lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    # Resources written into the record at connect time (as an older nbtrain did) are not the cluster's word.
    write_json(fake_cluster.dir.parent / "cluster.json",
               {"address": address, "kind": "local", "updated": time.time(), "resources": {"CPU": [2, 2]}})
    shown = lab.request("GET", "nbtrain/api/cluster")[1]["cluster"]
    assert (shown["resources"], shown["nodes"], shown["stale"]) == ({}, None, True)
    launch("silent", f"ray://127.0.0.1:{next(_ports)}")  # live on a cluster that never answers
    launch("job", address)
    fake_cluster.says("job", address)
    fake_cluster.has_nodes(address, 1, [2, 2])
    runs(lab)
    wait_for(lambda: lab.request("GET", "nbtrain/api/cluster")[1]["cluster"]["resources"].get("CPU") == [2, 2],
             what="the cluster's answer while the run is live")

    fake_cluster.says("job", address, "succeeded", step=100, ended=time.time())
    wait_for(run_shows(lab, "job", state="succeeded"), what="the run to end")
    fake_cluster.has_nodes(address, 1, [0, 2])  # Ray frees a run's CPUs a moment after it ends

    shown = wait_for(lambda: (c := lab.request("GET", "nbtrain/api/cluster")[1]["cluster"])["resources"]
                     .get("CPU") == [0, 2] and c, what="the CPUs to be shown free once the run ended")
    assert shown["kind"] == "local"  # the registry's word; the (fake) agent says "remote"
    assert shown["stale"] is False


def test_open_dashboard_cell_is_built_from_checked_strings_only(lab: JupyterLab, registry: Path,
                                                                       address: str) -> None:
    launch("alpha", address)
    write_json(registry / "runs" / "bare.json", {"name": "bare", "state": "running", "created": time.time()})
    hostile = {"evil-address": "ray://127.0.0.1:1\n!rm -rf ~", "evil-host": "ray://{os.system('id')}:10001"}
    for name, bad in hostile.items():
        write_json(registry / "runs" / f"{name}.json", {"name": name, "state": "running", "address": bad})
    write_json(registry / "runs" / "braces.json", {"name": "{__import__('os').system('id')}", "state": "running"})

    listed = runs(lab)

    assert listed["alpha"]["attach_cell"] == f"%ray_connect {address}\n%ray_attach alpha"
    assert listed["bare"]["attach_cell"] == "%ray_attach bare"
    for name in (*hostile, "{__import__('os').system('id')}"):
        run = listed[name]
        assert (run["attach_cell"], run["malformed"], run["terminal"], run["address"]) == (None, True, True, None)
        assert run["error"].startswith("This run cannot be shown: its ")
    assert "is not of the form ray://host:port" in listed["evil-host"]["error"]
    assert "is not a run name" in listed["{__import__('os').system('id')}"]["error"]
    status, body = lab.request("POST", "nbtrain/api/runs/evil-host/stop")
    assert status == 409 and "cannot be shown" in body["message"]
    assert not [call for call in calls(registry) if call[0] == "stop"]


def test_runs_a_cluster_reports_under_names_nbtrain_never_makes_are_not_listed(
        lab: JupyterLab, fake_cluster: FakeCluster, address: str) -> None:
    launch("mine", address)
    fake_cluster.says("{os.system('id')}", address)
    fake_cluster.says("-rf", address)
    fake_cluster.says("theirs", address, step=2)

    wait_for(run_shows(lab, "theirs", state="running"), what="the valid run the cluster reports")

    assert sorted(name for name, run in runs(lab).items() if run.get("address") == address) == ["mine", "theirs"]
    warning = next(line for line in lab.log().splitlines() if "names are not run names" in line)
    assert address in warning and "'-rf'" in warning and "{os.system('id')}" in warning


def test_one_malformed_run_is_an_error_row_and_the_others_are_listed(lab: JupyterLab, fake_cluster: FakeCluster,
                                                                     address: str) -> None:
    launch("fine", address)
    launch("listy", address)
    fake_cluster.says("fine", address, step=3)
    # What an older nbtrain on the cluster might answer: fields of the wrong type.
    write_json(fake_cluster.dir / "listy.json", {"name": "listy", "state": ["running"], "address": address})
    write_json(fake_cluster.dir / "halfway.json", {"name": "halfway", "state": "running", "progress": "half",
                                              "address": address})

    listed = wait_for(lambda: (r := runs(lab)).get("fine", {}).get("state") == "running" and r,
                      what="the cluster's answer to be served")

    assert listed["fine"]["malformed"] is False and listed["fine"]["progress"]["step"] == 3
    assert listed["listy"]["error"] == ("This run cannot be shown: its state is not text "
                                        f"(its record in the run registry with what {address} reports).")
    assert listed["halfway"]["error"] == ("This run cannot be shown: its 'progress' is not an object "
                                          f"(as {address} reports it).")
    assert [listed[name]["state"] for name in ("listy", "halfway")] == ["unknown", "unknown"]
    assert lab.request("GET", "nbtrain/api/runs/listy")[0] == 200


# -- connecting ahead, and a stop's own refresh, where periodic refreshes are far apart -------------

@pytest.fixture(scope="module")
def slow_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JupyterLab, Path]]:
    home = tmp_path_factory.mktemp("nbtrain-home-slow")
    server = start_lab(tmp_path_factory, home, refresh_interval=120.0)
    yield server, home
    server.stop()


def test_a_watched_run_gets_the_agent_connected_and_a_stop_shows_at_once(
        slow_lab: tuple[JupyterLab, Path], monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    lab, home = slow_lab
    monkeypatch.setenv("NBTRAIN_HOME", str(home))
    launch("watched", address)
    FakeCluster(home).says("watched", address, step=12)

    runs(lab)  # the first poll of a browser

    wait_for(lambda: refreshes(home, address) == 1, timeout=10, what="the agent to be asked about the run's cluster")
    assert wait_for(run_shows(lab, "watched", state="running"))["progress"]["step"] == 12
    assert lab.request("POST", "nbtrain/api/runs/watched/stop")[0] == 202
    wait_for(run_shows(lab, "watched", state="stopped"), timeout=10, what="the stopped run to be shown")
    assert calls(home) == [["runs", "--json", "--address", address], ["stop", "watched", "--address", address],
                           ["runs", "--json", "--address", address]]


# -- sweeps: a real one, through the real agent --------------------------------------------------

def quality(config: dict[str, Any]) -> None:
    """loss = q + 1/step: the smaller q, the better the trial at every step."""
    import time as _time

    for step in range(1, config["steps"] + 1):
        nbtrain.report(loss=config["q"] + 1.0 / step)
        _time.sleep(config["pause"])


def served_sweep(lab: JupyterLab, name: str) -> dict[str, Any] | None:
    status, body = lab.request("GET", "nbtrain/api/runs")
    assert status == 200, body
    return next((sweep for sweep in body["sweeps"] if sweep["name"] == name), None)


def test_the_run_list_carries_a_real_sweep_with_its_trials(cluster: Any, tmp_path_factory: pytest.TempPathFactory
                                                           ) -> None:
    from ray import tune

    lab = start_jupyterlab(tmp_path_factory.mktemp("sweep-root"), labextension=False,
                           server_config={"NbtrainServer": {"refresh_interval": 1.0}})
    try:
        # A browser watches: the agent connects to the cluster the session connected to.
        wait_for(lambda: (runs(lab), lab.request("GET", "nbtrain/api/cluster")[1]["cluster"]["nodes"])[1],
                 timeout=120, what="the real agent to answer for the session's cluster")
        sweep = nbtrain.tune(quality, space={"q": tune.grid_search([0.1, 3.0])}, config={"steps": 4, "pause": 0.2},
                             metric="loss", mode="min", scheduler="asha", max_t=4, grace_period=1,
                             reduction_factor=2, workers_per_trial=2, max_concurrent=1, name="served-sweep")

        live = wait_for(lambda: (s := served_sweep(lab, "served-sweep")) and s["state"] == "running" and s["trials"]
                        and s, timeout=60, what="the sweep to be served while it runs")
        assert (live["terminal"], live["stale"], live["malformed"]) == (False, False, False)
        assert sweep.wait(timeout=300) == "succeeded"
        done = wait_for(lambda: (s := served_sweep(lab, "served-sweep")) and s["state"] == "succeeded" and s,
                        timeout=60, what="the finished sweep to be served")
        # the list is the agent's last refresh: the trials' runs read as ended by the next one at the latest
        listed = wait_for(lambda: (r := runs(lab)) and all(r.get(t["run"], {}).get("terminal") for t in
                                                            done["trials"]) and r,
                          timeout=30, what="the trials' runs to be listed as ended")
    finally:
        lab.stop()

    trials = sweep.trials
    best = sweep.best
    assert best is not None and best.config["q"] == 0.1
    assert {key: done[key] for key in ("metric", "mode", "scheduler", "best", "address", "terminal", "error")} == {
        "metric": "loss", "mode": "min", "scheduler": "asha", "best": best.best, "address": cluster.address,
        "terminal": True, "error": None}
    assert [(t["index"], t["state"], t["best"], t["stop_reason"], t["run"], t["config"]) for t in done["trials"]] \
        == [(t.index, t.state, t.best, t.stop_reason, t.run_name, t.config) for t in trials]
    assert [t["state"] for t in done["trials"]] == ["succeeded", "stopped"]
    assert done["trials"][1]["stop_reason"].startswith("stopped by ASHA at rung")
    for trial in done["trials"]:  # each trial's run is an ordinary run of the list, with its "Open dashboard"
        run = listed[trial["run"]]
        # the session's cluster is this home's embedded one: a plain %ray_connect finds it
        assert run["attach_cell"] == f"%ray_connect\n%ray_attach {trial['run']}"
        assert run["terminal"] is True


def test_a_sweep_that_cannot_be_shown_is_an_error_row_and_an_unreadable_list_keeps_the_last() -> None:
    address = "ray://head:10001"
    trial = {"index": 0, "state": "running", "config": {"q": 0.1}, "iterations": 2, "last": 1.6, "best": 1.6,
             "stop_reason": None, "error": None, "waiting_for": None, "run": "good-t0"}
    good = {"name": "good", "state": "running", "metric": "loss", "mode": "min", "scheduler": "asha", "best": 1.6,
            "started": 10.0, "ended": None, "error": None, "trials": [trial]}
    hostile = {**good, "name": "hostile", "trials": [{**trial, "run": "x\n!rm -rf ~"}]}
    answers = ClusterAnswers()
    answers.store(address, json.dumps({"address": address, "cluster": None, "runs": [],
                                       "sweeps": [good, hostile, {**good, "name": "{os.system('id')}"}]}), 20.0)

    shown = {sweep["name"]: sweep for sweep in served_sweeps(answers, now=21.0, stale_after=60)}

    assert shown["good"] == {**good, "address": address, "updated": 20.0, "terminal": False, "stale": False,
                             "malformed": False}
    assert shown["hostile"]["trials"] == [] and shown["hostile"]["malformed"] is True
    assert "trial 0's run 'x\\n!rm -rf ~' is not a run name" in shown["hostile"]["error"]
    assert "is not a sweep name" in shown["{os.system('id')}"]["error"]
    assert served_sweeps(answers, now=200.0, stale_after=60)[0]["stale"] is True

    answers.store(address, json.dumps({"address": address, "cluster": None, "runs": []}), 30.0)  # sweeps unread
    assert [sweep["name"] for sweep in served_sweeps(answers, now=31.0, stale_after=60)] == [
        "good", "hostile", "{os.system('id')}"]  # live first


# -- how answers and records combine -------------------------------------------------------------

def test_a_resumed_run_shows_its_record_until_the_cluster_answers_again() -> None:
    address = "ray://head:10001"
    answers = ClusterAnswers()
    old = record_from_summary({"name": "r", "state": "succeeded", "step": 100, "total_steps": 100}, address)
    answers.store(address, json.dumps({"address": address, "cluster": None, "runs": [old]}), received=100.0)
    resumed = {"name": "r", "state": "pending", "address": address, "created": 150.0, "updated": 150.0}

    (shown,) = served_runs([resumed], answers, now=151.0, stale_after=60)
    assert (shown["state"], shown["terminal"]) == ("pending", False)

    new = record_from_summary({"name": "r", "state": "running", "step": 3, "total_steps": 100}, address)
    answers.store(address, json.dumps({"address": address, "cluster": None, "runs": [new]}), received=160.0)
    (shown,) = served_runs([resumed], answers, now=161.0, stale_after=60)
    assert (shown["state"], shown["progress"]["step"], shown["updated"]) == ("running", 3, 160.0)


def test_a_run_on_the_embedded_cluster_opens_with_a_plain_connect() -> None:
    """Its ports change each time it starts: the cell names none (the Compare cell takes its first line)."""
    records = [{"name": name, "state": "running", "address": address, "created": 1.0}
               for name, address in (("here", "127.0.0.1:41000"), ("there", "ray://head:10001"))]
    shown = {run["name"]: run for run in served_runs(records, ClusterAnswers(), now=2.0, stale_after=60,
                                                     embedded={"127.0.0.1:41000", "ray://127.0.0.1:41001"})}
    assert shown["here"]["attach_cell"] == "%ray_connect\n%ray_attach here"
    assert shown["there"]["attach_cell"] == "%ray_connect ray://head:10001\n%ray_attach there"


def test_an_answer_that_is_not_one_keeps_the_last_good_one() -> None:
    answers = ClusterAnswers()
    answers.store("a", json.dumps({"address": "a", "cluster": None, "runs": [{"name": "r", "state": "running"}]}), 1.0)
    for bad in ("Traceback (most recent call last):", "[]", '{"runs": 3}'):
        with pytest.raises(ValueError):
            answers.store("a", bad, 2.0)
    assert [run["name"] for run in answers.runs()] == ["r"]


def test_default_agent_is_the_nbtrain_cli_and_its_failures_say_why(tmp_path: Path) -> None:
    """The real ``python -m nbtrain agent``, asked about a cluster that is not there."""
    import asyncio
    import concurrent.futures
    import logging

    from nbtrain._lab.sidebar_agent import CommandRunner, NbtrainServer

    settings = NbtrainServer()
    assert settings.agent_command == [sys.executable, "-m", "nbtrain", "agent"]
    # cwd: `python -m` finds this checkout's nbtrain first.
    runner = CommandRunner(settings, tmp_path, str(REPO), logging.getLogger("test"))
    ghost = {"name": "ghost", "state": "running", "address": "ray://127.0.0.1:1", "terminal": False}

    async def refresh_and_stop() -> tuple[tuple[bool, str], dict[str, Any]]:
        refreshed = await runner.refresh("ray://127.0.0.1:1")
        runner.request_stop(dict(ghost))
        await asyncio.gather(*runner._tasks)
        outcome = runner._annotate(dict(ghost))["stop"]
        await runner._agent.close()
        return refreshed, outcome

    # its own thread: pytest-playwright keeps an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        (ok, why), outcome = pool.submit(asyncio.run, refresh_and_stop()).result()

    assert not ok
    assert "Nothing is listening at ray://127.0.0.1:1" in why
    assert outcome["status"] == "failed"
    assert "Nothing is listening at ray://127.0.0.1:1" in outcome["message"]
    assert list(tmp_path.iterdir()) == []  # reading and failing wrote nothing
