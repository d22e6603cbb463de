"""Authenticating the notebook to a Ray cluster: which token, how it travels, and a fast check first.

How the token travels. ``ray.init("ray://…", _metadata=[("authorization", "Bearer …")])``
hands Ray Client gRPC metadata that it sends on every call of that session: the
first ping, every unary call, the data and log streams, and the proxy passes it
on to the session's own server (Ray 2.60: ``ray/util/client/worker.py`` keeps it
in ``Worker.metadata``; ``dataclient.py`` and ``logsclient.py`` send it). Ray's
own client-side token support reads ``RAY_AUTH_MODE`` once, when ``ray`` is
first imported, so leaning on it meant editing ``os.environ`` before anything
imported ray. The header per connection works whatever was imported first,
needs no environment variable or file, and sends each cluster only its own
token. ``_metadata`` is a private argument of ``ray.init``;
``tests/test_import_order.py`` pins it against the installed Ray.

When this kernel's Ray has token mode on anyway (``RAY_AUTH_MODE=token`` in its
environment), Ray's interceptor appends the token Ray finds itself; servers read
the first ``authorization`` header, which is ours. With the mode on and no token
of its own Ray refuses before sending anything; :func:`check_kernel_ray` says so.

The cluster's own processes (the embedded head, its Ray Client server, actors)
authenticate to each other with the token in the environment they were started
with (``local_cluster.ray_env``); nothing here concerns them.

Ray Client reports a dead address, a missing token and a wrong token all as
``ConnectionError: ray client connection timeout`` after ~30 s. :func:`preflight`
tells them apart first, in milliseconds: is anything listening on the port
(TCP), and does a Ray Client *ping* with our token come back ``UNAUTHENTICATED``?
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from nbtrain._client import local_cluster
from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import port_is_open

PREFLIGHT_TIMEOUT_S = 3.0


def resolve_token(token: str | None, address: str) -> str | None:
    """The token for ``address``: ``token``, else the embedded cluster's own (for its address
    only), else Ray's usual places: ``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``."""
    if token:
        return token
    local = local_cluster.status()
    if local is not None and local.address == address:
        return read_token(local.token_path)
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), Path.home() / ".ray" / "auth_token"):
        if candidate and Path(candidate).is_file():
            text = read_token(candidate)
            if text:
                return text
    return None


def read_token(path: str | Path) -> str:
    return Path(path).read_text().strip()


def grpc_metadata(token: str | None) -> list[tuple[str, str]]:
    """What ``ray.init(address, _metadata=...)`` sends with every call of the session."""
    return [("authorization", f"Bearer {token}")] if token else []


def check_kernel_ray(address: str) -> None:
    """Fail fast, and say why, when this process's Ray would refuse to send anything at all.

    Ray reads ``RAY_AUTH_MODE`` at import; with it on, every Ray channel asks Ray's
    own token loader first, and that raises when it finds no token.
    """
    from ray._raylet import (  # type: ignore[attr-defined]  # compiled; its stub lacks these
        AuthenticationMode,
        AuthenticationTokenLoader,
        get_authentication_mode,
    )
    from ray.exceptions import AuthenticationError

    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()  # the loader keeps what it read first; the user may have set a token since
    try:
        if loader.has_token():
            return
    except AuthenticationError:
        pass
    msg = (f"Cannot connect to {address}: Ray in this kernel has token authentication on "
           f"(RAY_AUTH_MODE=token in the kernel's environment) but no token of its own, so it refuses "
           f"every connection before nbtrain can send the cluster's token. Remove RAY_AUTH_MODE from the "
           f"kernel's environment and restart the kernel (nbtrain sends the token itself), or give Ray "
           f"the token: os.environ['RAY_AUTH_TOKEN_PATH'] = '<the cluster's token file>'.")
    raise ConnectionFailedError(msg)


def preflight(address: str, host: str, port: int, token: str | None) -> None:
    """Raise :class:`ConnectionFailedError` naming the cause when ``address`` will not take us."""
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror:
        msg = f"Cannot resolve the host in {address}. Check the spelling of the head node's name."
        raise ConnectionFailedError(msg) from None
    if not port_is_open(host, port, timeout=PREFLIGHT_TIMEOUT_S):
        msg = (f"Nothing is listening at {address}. Check that the Ray head is running "
               f"(`ray status` on the head), that {port} is its Ray Client port "
               f"(`ray start --head --ray-client-server-port={port}`), and that a firewall or "
               f"port-forward lets this machine reach {host}:{port}.")
        raise ConnectionFailedError(msg)
    import grpc
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    # A plain channel, not Ray's: Ray's adds its own token when this kernel's Ray has token mode on.
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        stub.ClusterInfo(ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING),
                         timeout=PREFLIGHT_TIMEOUT_S * 2, metadata=grpc_metadata(token))
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            if token:
                msg = (f"The cluster at {address} rejected the authentication token. Pass the cluster's "
                       f"token: `nbtrain.connect(address, token=...)` or set RAY_AUTH_TOKEN "
                       f"(on the head: `ray get-auth-token`).")
            else:
                msg = (f"The cluster at {address} requires a token (RAY_AUTH_MODE=token) and none was given. "
                       f"Pass `token=` or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH "
                       f"(on the head: `ray get-auth-token`).")
            raise ConnectionFailedError(msg) from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
            msg = (f"Something is listening at {address}, but it does not answer as a Ray Client server "
                   f"({code.name}). Check the port: it must be the head's Ray Client port "
                   f"(--ray-client-server-port, 10001 by default), not the GCS or dashboard port.")
            raise ConnectionFailedError(msg) from None
    finally:
        channel.close()
