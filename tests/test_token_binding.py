"""A cluster's token goes to that cluster only, and ``%ray_connect`` takes a token without writing it
into the notebook.

The other clusters are fake Ray Client servers on 127.0.0.1 (a remote machine cannot exist here):
gRPC servers that record the ``authorization`` header of every call they receive. One answers
Ray Client's ping for a single token (and then fails the session, as no Ray is behind it); one
refuses every token. The embedded cluster is the session's real one.
"""

from __future__ import annotations

import getpass
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from IPython.core.error import UsageError

import nbtrain
from nbtrain._client.connecting import connection
from nbtrain._client.connecting.auth import read_token, remember_token, remembered_tokens, resolve_token, tokens_file
from nbtrain._client.local import local_cluster

from _helpers import ipython_shell


class FakeCluster(grpc.GenericRpcHandler):
    """A Ray Client port that records what it is sent; it takes ``accept`` as a token, or none at all."""

    def __init__(self, accept: str | None) -> None:
        self.accept = accept
        self.headers: list[str | None] = []  # the authorization header of each call, in order
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[self])
        self.address = f"ray://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        from ray.core.generated import ray_client_pb2

        header = dict(details.invocation_metadata).get("authorization")
        self.headers.append(header)
        accepted = self.accept is not None and header == f"Bearer {self.accept}"

        def cluster_info(request: Any, context: grpc.ServicerContext) -> Any:
            if not accepted:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "fake cluster: wrong or no token")
            return ray_client_pb2.ClusterInfoResponse(json="{}")

        def no_ray_here(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "fake cluster: no Ray behind this port")

        if details.method.endswith("/ClusterInfo"):
            return grpc.unary_unary_rpc_method_handler(
                cluster_info, request_deserializer=ray_client_pb2.ClusterInfoRequest.FromString,
                response_serializer=ray_client_pb2.ClusterInfoResponse.SerializeToString)
        if details.method.endswith(("/Datapath", "/Logstream")):
            return grpc.stream_stream_rpc_method_handler(no_ray_here)
        return grpc.unary_unary_rpc_method_handler(no_ray_here)


@pytest.fixture
def fake_cluster() -> Iterator[Callable[[str | None], FakeCluster]]:
    started: list[FakeCluster] = []

    def start(accept: str | None) -> FakeCluster:
        started.append(FakeCluster(accept))
        return started[-1]

    yield start
    for fake in started:
        fake.server.stop(grace=None)


@pytest.fixture
def no_machine_tokens(monkeypatch, tmp_path):
    """This machine's own ``~/.ray/auth_token`` and ``$RAY_AUTH_*`` stay out of the test."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    yield
    tokens_file().unlink(missing_ok=True)


def _quiet(_message: str) -> None:
    pass


def test_a_token_reaches_only_the_cluster_it_was_given_for(cluster, fake_cluster, no_machine_tokens, monkeypatch):
    a, b = fake_cluster("token-for-a"), fake_cluster(None)
    # As `local_cluster.ray_env()` hands it to a plain-Ray driver: the embedded cluster's token file.
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(local_cluster.token_path()))
    try:
        # a takes the token (the ping), then turns out to have no Ray behind it: timeout=0, one try.
        with pytest.raises(nbtrain.ConnectionFailedError, match=f"Could not connect to {a.address}"):
            nbtrain.connect(a.address, token="token-for-a", timeout=0, progress=_quiet)
        assert a.headers and set(a.headers) == {"Bearer token-for-a"}, a.headers
        assert stat.S_IMODE(tokens_file().stat().st_mode) == 0o600
        a.headers.clear()
        with pytest.raises(nbtrain.ConnectionFailedError, match=f"Could not connect to {a.address}"):
            nbtrain.connect(a.address, timeout=0, progress=_quiet)  # no token: the one given for a
        assert a.headers and set(a.headers) == {"Bearer token-for-a"}, a.headers

        monkeypatch.setenv("RAY_AUTH_TOKEN", "token-for-a")
        began = time.monotonic()
        with pytest.raises(nbtrain.ConnectionFailedError, match="requires a token") as refused:
            nbtrain.connect(b.address, timeout=0, progress=_quiet)
        assert time.monotonic() - began < 5
        assert b.headers == [None]  # neither a's token nor the embedded cluster's
        assert f"$RAY_AUTH_TOKEN (it is the token of {a.address})" in str(refused.value)
        assert "$RAY_AUTH_TOKEN_PATH (it is the token of the embedded local cluster)" in str(refused.value)
        with pytest.raises(nbtrain.ConnectionFailedError, match=r"rejected the authentication token \(token=\)"):
            nbtrain.connect(b.address, token="token-for-b", timeout=0, progress=_quiet)
        assert b.headers[1:] == ["Bearer token-for-b"]
        assert remembered_tokens() == {a.address: "token-for-a"}  # a refused token is not kept
    finally:
        # The embedded cluster gets its own token, whatever the environment holds.
        nbtrain.connect(cluster.address, progress=_quiet)
    assert connection.current().address == cluster.address


@pytest.mark.quick
def test_tokens_are_kept_per_address_and_the_embedded_token_stays_home(no_machine_tokens, monkeypatch, tmp_path):
    monkeypatch.setenv("NBTRAIN_HOME", str(tmp_path / "nbtrain"))
    embedded = local_cluster.token_path()
    embedded.parent.mkdir(parents=True)
    embedded.write_text("the-embedded-token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(embedded))

    threads = [threading.Thread(target=remember_token, args=(f"ray://host-{i}:10001", f"token-{i}"))
               for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert remembered_tokens() == {f"ray://host-{i}:10001": f"token-{i}" for i in range(16)}
    assert stat.S_IMODE(tokens_file().stat().st_mode) == 0o600

    assert resolve_token(None, "ray://host-3:10001").value == "token-3"
    assert resolve_token("given", "ray://host-3:10001").value == "given"
    assert resolve_token(None, "ray://elsewhere:10001").value is None
    monkeypatch.setenv("RAY_AUTH_TOKEN", "token-5")
    assert resolve_token(None, "ray://elsewhere:10001").value is None
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-team-token")
    assert resolve_token(None, "ray://elsewhere:10001") == ("the-team-token", "$RAY_AUTH_TOKEN", ())


# ---------------------------------------------------------------------------------- %ray_connect

@pytest.fixture(scope="module")
def ip():
    return ipython_shell()


def _usage_error(ip, line: str) -> str:
    result = ip.run_cell(line)
    assert isinstance(result.error_in_exec, UsageError), f"expected a UsageError, got {result.error_in_exec!r}"
    return str(result.error_in_exec)


@pytest.mark.quick
def test_ray_connect_help_says_why_not_to_type_the_token(ip, capsys):
    assert ip.run_cell("%ray_connect --help").error_in_exec is None
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--token-file PATH", "--ask-token", "$RAY_AUTH_TOKEN", "--token TOKEN"):
        assert flag in out
    assert "saved in the notebook and in IPython's history" in out
    assert "give the token one way, not --token and --ask-token" in _usage_error(
        ip, "%ray_connect ray://127.0.0.1:1 --token x --ask-token")


def test_ray_connect_takes_the_token_from_a_file_a_hidden_prompt_or_the_environment(
        cluster, fake_cluster, no_machine_tokens, ip, monkeypatch, tmp_path, capsys):
    missing = tmp_path / "no-such-token"
    assert f"cannot read {missing}" in _usage_error(ip, f"%ray_connect {cluster.address} --token-file {missing}")
    assert connection.current().address == cluster.address  # nothing was touched
    wrong, right = tmp_path / "wrong", tmp_path / "right"
    wrong.write_text("not-the-token\n")
    right.write_text(read_token(local_cluster.token_path()) + "\n")
    try:
        assert "rejected the authentication token" in _usage_error(
            ip, f"%ray_connect {cluster.address} --token-file {wrong}")

        fake = fake_cluster(None)
        _usage_error(ip, f"%ray_connect {fake.address} --token-file {wrong}")
        monkeypatch.setattr(getpass, "getpass", lambda prompt="": "typed-unseen")
        _usage_error(ip, f"%ray_connect {fake.address} --ask-token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-environment")
        _usage_error(ip, f"%ray_connect {fake.address}")
        capsys.readouterr()
        _usage_error(ip, f"%ray_connect {fake.address} --token on-the-line")
        assert "--token keeps the token in this notebook" in capsys.readouterr().out
        assert fake.headers == ["Bearer not-the-token", "Bearer typed-unseen", "Bearer from-the-environment",
                                "Bearer on-the-line"]
    finally:
        result = ip.run_cell(f"%ray_connect {cluster.address} --token-file {right}")
    assert result.error_in_exec is None, result.error_in_exec
    assert f"Connected: {cluster.address}" in capsys.readouterr().out
