"""Connecting: the embedded cluster stays on loopback with a token; bad addresses fail fast and clearly;
connecting records the cluster once, and reading the local cluster's state writes nothing."""

from __future__ import annotations

import socket
import threading
import time

import psutil
import pytest

import nbtrain
from nbtrain._client.connecting import connection, version_check
from nbtrain._client.connecting.auth import preflight, read_token, resolve_token
from nbtrain._client.connecting.cluster_address import parse as parse_address
from nbtrain._client.local import local_cluster
from nbtrain._registry import read_cluster


def _cluster_processes() -> list[psutil.Process]:
    info = local_cluster.status()
    assert info is not None
    return [p for p in psutil.process_iter() if _safe_pgid(p.pid) == info.pid]


def _safe_pgid(pid: int) -> int | None:
    import os

    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_every_listening_socket_of_the_local_cluster_is_on_loopback(cluster):
    listening = []
    for proc in _cluster_processes():
        try:
            conns, name = proc.net_connections(kind="inet"), proc.name()
        except psutil.Error:  # ended meanwhile
            continue
        listening += [(name, c.laddr) for c in conns if c.status == psutil.CONN_LISTEN]
    assert listening, "found no listening sockets of the cluster"
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    assert all(addr.ip in loopback for _name, addr in listening), listening


def test_client_port_refuses_a_connection_without_the_token(cluster):
    address = local_cluster.status().address  # its Ray Client port, whichever way this session connected
    target = parse_address(address)
    host, port = target.host, target.port
    began = time.monotonic()
    with pytest.raises(nbtrain.ConnectionFailedError, match="requires a token"):
        preflight(address, host, port, token=None)
    with pytest.raises(nbtrain.ConnectionFailedError, match="rejected the authentication token"):
        preflight(address, host, port, token="not-the-token")
    preflight(address, host, port, token=read_token(local_cluster.status().token_path))
    assert time.monotonic() - began < 5


def test_unreachable_address_fails_within_15_s_naming_it(cluster):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # held, never listening: nobody else takes the port meanwhile
        port = sock.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(nbtrain.ConnectionFailedError, match=f"Nothing is listening at ray://127.0.0.1:{port}"):
            preflight(f"ray://127.0.0.1:{port}", "127.0.0.1", port, token=None)
        assert time.monotonic() - began < 15


def test_a_port_that_is_not_ray_client_is_named_as_such(cluster):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    stop = threading.Event()

    def accept_and_hang_up():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_hang_up, daemon=True)
    thread.start()
    try:
        began = time.monotonic()
        with pytest.raises(nbtrain.ConnectionFailedError, match="does not answer as a Ray Client server"):
            preflight(f"ray://127.0.0.1:{port}", "127.0.0.1", port, token=None)
        assert time.monotonic() - began < 15
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.mark.quick
def test_non_ray_scheme_is_refused():
    with pytest.raises(nbtrain.ConnectionFailedError, match="is not an address nbtrain connects to: give ray://host:10001"):
        nbtrain.connect("http://example.invalid:8265")


@pytest.mark.quick
def test_versions_that_differ_are_both_named():
    from nbtrain._client.connecting.version_check import check_versions

    with pytest.raises(nbtrain.VersionMismatchError) as raised:
        check_versions({"ray": "2.50.0", "python": "3.10.12", "nbtrain": "0.1.0"},
                       {"ray": "2.60.0", "python": "3.11.7"})
    message = str(raised.value)
    assert "Ray 2.60.0 in the notebook but Ray 2.50.0 on the cluster" in message
    assert "Python 3.11.7 in the notebook but Python 3.10.12 on the cluster" in message


@pytest.mark.quick
@pytest.mark.parametrize("kwargs,expected", [
    ({"address": 123}, "connect(address=...) must be a string like 'ray://head:10001' (the head node's Ray "
                       "Client port), 'head:6379' or 'auto' (a kernel on the cluster), or None for the embedded local "
                       "cluster; got int 123."),
    ({"address": b"ray://h:1"}, "connect(address=...) must be a string like 'ray://head:10001'"),
    ({"address": "ray://127.0.0.1:1", "token": 123},
     "connect(token=...) must be a string, the cluster's token (on the head: `ray get-auth-token`), or None; got int."),
])
def test_an_address_or_token_that_is_not_a_string_is_named_at_once(kwargs, expected):
    began = time.monotonic()
    with pytest.raises(nbtrain.ConnectionFailedError) as raised:
        nbtrain.connect(**kwargs, progress=lambda _m: None)
    assert expected in str(raised.value)
    assert time.monotonic() - began < 1


@pytest.mark.quick
@pytest.mark.parametrize("version", ["2.53.1", "2.52.0", "2.40.0"])
@pytest.mark.parametrize("side,where,fix", [
    ("notebook", "in this notebook's environment", "in the kernel's environment and restart the kernel"),
    ("cluster", "on the cluster", "on every node of the cluster and restart it"),
])
def test_a_ray_older_than_2_54_is_refused_saying_where_and_why(version, side, where, fix):
    from nbtrain._client.connecting.version_check import check_ray_supported

    with pytest.raises(nbtrain.VersionMismatchError) as raised:
        check_ray_supported(version, side)
    message = str(raised.value)
    assert f"Ray {version} {where} is too old: nbtrain needs Ray >= 2.54" in message
    assert "the dashboard agent's HTTP job endpoint does not check the token" in message
    assert f'Upgrade Ray {fix}: `pip install -U "ray[client,default]>=2.54"`' in message


@pytest.mark.quick
@pytest.mark.parametrize("version", ["2.61.0", "2.62.3", "3.0.0.dev0"])
def test_a_ray_outside_the_tested_range_is_refused_naming_both(version):
    from nbtrain._client.connecting.version_check import check_ray_supported

    with pytest.raises(nbtrain.VersionMismatchError) as raised:
        check_ray_supported(version, "cluster")
    message = str(raised.value)
    assert (f"Ray {version} on the cluster is not one nbtrain {nbtrain.__version__} is tested with "
            f"(Ray 2.54 to 2.60)") in message
    assert 'pip install "ray[client,default,train]==2.60.*"' in message


@pytest.mark.quick
def test_an_nbtrain_that_differs_on_the_cluster_is_named():
    from nbtrain._client.connecting.version_check import check_versions

    with pytest.raises(nbtrain.VersionMismatchError) as raised:
        check_versions({"ray": "2.60.0", "python": "3.11.7", "nbtrain": "0.0.9"},
                       {"ray": "2.60.0", "python": "3.11.7", "nbtrain": "0.1.0"})
    message = str(raised.value)
    assert "nbtrain 0.1.0 in the notebook but nbtrain 0.0.9 on the cluster" in message
    assert '`pip install "nbtrain==0.0.9" "ray[client,default,train]==2.60.0"`' in message
    check_versions({"ray": "2.60.0", "python": "3.11.7", "nbtrain": "0.1.0"},
                   {"ray": "2.60.0", "python": "3.11.7", "nbtrain": "0.1.0"})


@pytest.mark.quick
def test_supported_rays_pass_and_ray_clients_mismatch_names_an_old_cluster():
    from nbtrain._client.connecting.connect_errors import explain
    from nbtrain._client.connecting.connection import check_ray_supported

    for version in ("2.54.0", "2.54.1", "2.56.1", "2.57.0", "2.59.2", "2.60.0", "2.60.1", "2.60.1rc1"):
        check_ray_supported(version, "cluster")
    ray_client_says = RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.53.0\n"
                                   "    Python: 3.11.7\nThis process on Ray Client was started with:\n"
                                   "    Ray: 2.60.0\n    Python: 3.11.7\n")
    error = explain("ray://head:10001", ray_client_says)
    assert isinstance(error, nbtrain.VersionMismatchError)
    assert str(error).startswith("Ray 2.53.0 on the cluster is too old: nbtrain needs Ray >= 2.54")


def test_connecting_recorded_the_cluster_for_the_sidebar(cluster):
    record = read_cluster()
    assert record is not None
    assert (record["address"], record["kind"]) == (cluster.address, "local")


def test_the_embedded_token_goes_to_the_embedded_cluster_only(cluster, monkeypatch):
    own = read_token(local_cluster.status().token_path)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "someone-elses-token")
    assert resolve_token(None, cluster.address).value == own
    assert resolve_token(None, "ray://127.0.0.1:1").value == "someone-elses-token"
    assert resolve_token("given", cluster.address).value == "given"


def test_reading_the_local_cluster_state_creates_nothing(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("NBTRAIN_HOME", str(home))
    assert local_cluster.status() is None
    assert not local_cluster.token_path().exists()
    assert not home.exists()


class AnchorClassWithoutProcess:
    """Ray's actor class for the session's anchor, as if no worker process had started for it yet: an answer
    from it would wait for one."""

    def __init__(self) -> None:
        self.created = 0

    def options(self, **_options: object) -> AnchorClassWithoutProcess:
        return self

    def remote(self) -> AnchorClassWithoutProcess:
        self.created += 1
        return self

    @property
    def versions(self) -> object:
        raise AssertionError("connect() waited for the anchor's process to answer")


@pytest.mark.quick
def test_joining_the_embedded_cluster_as_a_driver_starts_the_anchor_without_waiting_for_its_process(monkeypatch):
    """The embedded head was started from this environment (the notebook checked it), so its workers run this Ray,
    Python and nbtrain: connect() starts the session's anchor and goes on, and the cluster reports this
    environment's versions."""
    import ray

    anchor = AnchorClassWithoutProcess()
    monkeypatch.setattr(ray, "remote", lambda _cls: anchor)
    started, versions = connection._start_session_anchor(None, versions_known=True)
    assert started is anchor and anchor.created == 1
    assert versions == version_check.notebook_versions()
