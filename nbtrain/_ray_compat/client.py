"""Ray Client in the notebook's kernel: the token's header, Ray's own token mode, the server's ping, auto-init."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nbtrain._ray_compat.notice import reason, say_once


def init_with_metadata(address: str, metadata: Sequence[tuple[str, str]], **kwargs: Any) -> Any:
    """``ray.init(address, **kwargs)`` that sends ``metadata`` (gRPC headers: the token) with every call.

    Public instead: none in Ray 2.60 (Ray's own token mode reads ``RAY_AUTH_MODE`` once, at ``import ray``:
    see :mod:`nbtrain._client.auth`). Degrades: a Ray that refuses ``_metadata`` makes ``connect()`` fail
    with Ray's error for the argument; ``tests/test_import_order.py`` pins it against the installed Ray.
    """
    import ray

    return ray.init(address, _metadata=list(metadata), **kwargs)


def kernel_ray_lacks_token() -> bool:
    """Whether this process's Ray has its own token mode on (``RAY_AUTH_MODE=token``) and no token to send.

    Public instead: none (Ray's token loader lives in ``ray._raylet``). Degrades: where the loader
    cannot be read, False, said once on stderr: ``connect()`` skips its fast, explained refusal and Ray's
    own error comes instead.
    """
    try:
        from ray._raylet import (  # type: ignore[attr-defined]  # compiled; its stub lacks these
            AuthenticationMode,
            AuthenticationTokenLoader,
            get_authentication_mode,
        )
        from ray.exceptions import AuthenticationError
    except ImportError as exc:
        say_once(f"cannot read Ray's own token mode in this kernel ({reason(exc)}); not checked before connecting")
        return False
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return False
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()  # the loader keeps what it read first; the user may have set a token since
    try:
        return not loader.has_token()
    except AuthenticationError:
        return True


def ping_client_server(host: str, port: int, metadata: Sequence[tuple[str, str]], timeout_s: float,
                       credentials: Any = None) -> None:
    """One Ray Client ``ClusterInfo(PING)`` over a gRPC channel of nbtrain's (not Ray's: Ray's adds its own
    token when this kernel's Ray has token mode on), TLS with ``credentials`` where given; raises
    ``grpc.RpcError`` as the server answers.

    Public instead: none (``ray.init`` reports a dead address, a missing and a wrong token all as a
    timeout after ~30 s). Degrades: without Ray Client's protos, no ping, said once on stderr:
    a missing or wrong token shows as Ray Client's timeout instead of a message in milliseconds.
    """
    import grpc

    try:
        from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc
    except ImportError as exc:
        say_once(f"cannot ping the Ray Client server before connecting ({reason(exc)})")
        return
    target = f"{host}:{port}"
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    try:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        stub.ClusterInfo(ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING),
                         timeout=timeout_s, metadata=list(metadata))
    finally:
        channel.close()


def turn_off_auto_init() -> None:
    """Make a Ray call in this process raise while not connected, instead of starting a Ray inside it.

    Without this, a call reaching Ray after ``disconnect()`` (a dashboard's follower thread, a cell run
    against a dropped connection) makes Ray start a private cluster inside the kernel: with Ray's
    defaults (not loopback-only, no token), ignored by the sidebar, and killing the kernel with it
    when it goes. Once nbtrain manages the connection, "not connected" is an error that says so.

    Public instead: ``RAY_ENABLE_AUTO_CONNECT=0``, which Ray reads only when it is imported (too late in
    a kernel that imported ``ray`` first). Degrades: said once on stderr; a Ray call after
    ``disconnect()`` may then start a private Ray in the kernel, as plain Ray does.
    """
    try:
        from ray._private import auto_init_hook

        auto_init_hook.enable_auto_connect = False
    except ImportError as exc:
        say_once(f"cannot turn off Ray's auto-init in this kernel ({reason(exc)}): a Ray call made while "
                 f"disconnected may start a Ray inside it")
