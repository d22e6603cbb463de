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
token. ``_metadata`` is a private argument of ``ray.init``
(:func:`nbtrain._ray_compat.init_with_metadata`); ``tests/test_import_order.py`` pins it
against the installed Ray.

Which token. The header goes in plain gRPC (unless the cluster runs Ray's TLS: see
:mod:`nbtrain._client.connecting.tls`), so whoever listens at an address reads it:
:func:`resolve_token` gives an address only a token meant for it. A token the
user gave for an address is kept for that address (``tokens.json`` in nbtrain's
home, 0600) once the cluster accepted it; the embedded cluster's token goes to the
embedded cluster alone; Ray's usual places are used for other addresses unless
what they hold is one of those.

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

A kernel that joins the cluster as a Ray driver (a GCS address) sends the token
through Ray's own channels (:func:`nbtrain._ray_compat.driver_token`): the only token
it knows for that address. :func:`preflight_gcs` first reads the cluster's
versions from its GCS with the token, which tells a dead address, a refused token
and a port of another kind apart as fast. Each kind of server answers a call of the
other's with ``UNIMPLEMENTED`` before it looks at the token, so a Ray Client port
given as a GCS address (or the reverse) is named as such.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from nbtrain._client.connecting import cluster_address, tls
from nbtrain._client.connecting.cluster_address import ClusterAddress
from nbtrain._client.local import local_cluster
from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import port_is_open
from nbtrain._paths import nbtrain_home, private_dir, read_json, write_json_atomic
from nbtrain._ray_compat import cluster_metadata, kernel_ray_lacks_token, ping_client_server

PREFLIGHT_TIMEOUT_S = 3.0
BESIDE_TIMEOUT_S = 0.5  # a GCS beside a Ray Client server answers in ms, or is not there to ask


class ResolvedToken(NamedTuple):
    """The token for one address, where it came from (for error messages), and the places
    that held a token but were passed over because it belongs to another cluster."""

    value: str | None
    source: str = ""
    withheld: tuple[str, ...] = ()


def resolve_token(token: str | None, address: str) -> ResolvedToken:
    """The token for ``address``, and only a token meant for it.

    In order: ``token``; the embedded cluster's own token (for its addresses only); the
    token given earlier for this address (:func:`remember_token`); Ray's usual places,
    ``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``, unless what is
    there is the embedded cluster's token or one given for another address. The token
    travels in plain gRPC metadata, so a cluster must never receive another's.
    """
    if token:
        return ResolvedToken(token, "token=")
    local = local_cluster.status()
    if local is not None and address in local.addresses:
        return ResolvedToken(read_token(local.token_path), "the embedded cluster's token")
    remembered = remembered_tokens()
    if remembered.get(address):
        return ResolvedToken(remembered[address], f"the token given earlier for {address}")
    owners = {value: other for other, value in remembered.items()}
    embedded = local_cluster.token_path()
    if embedded.is_file():
        owners[read_token(embedded)] = "the embedded local cluster"
    withheld = []
    for source, value in _ray_default_tokens():
        if value in owners:
            withheld.append(f"{source} (it is the token of {owners[value]})")
            continue
        return ResolvedToken(value, source, tuple(withheld))
    return ResolvedToken(None, "", tuple(withheld))


def _ray_default_tokens() -> list[tuple[str, str]]:
    """Where Ray itself looks for a token, in Ray's order, with what each place holds."""
    found = []
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        found.append(("$RAY_AUTH_TOKEN", os.environ["RAY_AUTH_TOKEN"].strip()))
    for source, candidate in (("$RAY_AUTH_TOKEN_PATH", os.environ.get("RAY_AUTH_TOKEN_PATH")),
                              ("~/.ray/auth_token", Path.home() / ".ray" / "auth_token")):
        if candidate and Path(candidate).is_file():
            text = read_token(candidate)
            if text:
                found.append((source, text))
    return found


def read_token(path: str | Path) -> str:
    return Path(path).read_text().strip()


def tokens_file() -> Path:
    """Tokens given with ``connect(address, token=...)``, by address (owner-only, 0600)."""
    return nbtrain_home() / "tokens.json"


def remembered_tokens() -> dict[str, str]:
    data = read_json(tokens_file())
    if not isinstance(data, dict):
        return {}
    return {address: value for address, value in data.items() if isinstance(value, str) and value}


def remember_token(address: str, token: str) -> None:
    """Keep ``token`` for ``address`` only, so a later ``connect(address)``, ``nbtrain runs`` and
    the lab sidebar's agent reach that cluster without the token being typed again."""
    path = tokens_file()
    private_dir(path.parent)
    lock_fd = os.open(path.with_name(".tokens.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # two kernels (or threads) at once each keep their token
        tokens = remembered_tokens()
        if tokens.get(address) != token:
            write_json_atomic(path, {**tokens, address: token})
    finally:
        os.close(lock_fd)


def grpc_metadata(token: str | None) -> list[tuple[str, str]]:
    """What ``ray.init(address, _metadata=...)`` sends with every call of the session."""
    return [("authorization", f"Bearer {token}")] if token else []


def check_kernel_ray(address: str) -> None:
    """Fail fast, and say why, when this process's Ray would refuse to send anything at all.

    Ray reads ``RAY_AUTH_MODE`` at import; with it on, every Ray channel asks Ray's
    own token loader first, and that raises when it finds no token.
    """
    if not kernel_ray_lacks_token():
        return
    msg = (f"Cannot connect to {address}: Ray in this kernel has token authentication on "
           f"(RAY_AUTH_MODE=token in the kernel's environment) but no token of its own, so it refuses "
           f"every connection before nbtrain can send the cluster's token. Remove RAY_AUTH_MODE from the "
           f"kernel's environment and restart the kernel (nbtrain sends the token itself), or give Ray "
           f"the token: os.environ['RAY_AUTH_TOKEN_PATH'] = '<the cluster's token file>'.")
    raise ConnectionFailedError(msg)


def preflight(address: str, host: str, port: int, token: str | None, *, source: str = "",
              withheld: Sequence[str] = ()) -> None:
    """Raise :class:`ConnectionFailedError` naming the cause when ``address`` will not take us.

    ``source`` says where ``token`` came from and ``withheld`` which tokens were not sent
    (:class:`ResolvedToken`), so a refusal can say which token to fix.
    """
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

    try:
        ping_client_server(host, port, grpc_metadata(token), PREFLIGHT_TIMEOUT_S * 2,
                           tls.channel_credentials(address))
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            if token:
                origin = f" ({source})" if source else ""
                msg = (f"The cluster at {address} rejected the authentication token{origin}. Pass the "
                       f"cluster's token: `nbtrain.connect(address, token=...)` or set RAY_AUTH_TOKEN "
                       f"(on the head: `ray get-auth-token`).")
            else:
                msg = (f"The cluster at {address} requires a token (RAY_AUTH_MODE=token) and none was given. "
                       f"Pass `token=` or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH "
                       f"(on the head: `ray get-auth-token`).")
                if withheld:
                    msg += (" Not sent, because nbtrain sends a cluster's token only to that cluster: "
                            + "; ".join(withheld) + ".")
            raise ConnectionFailedError(msg) from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
            if code != grpc.StatusCode.UNIMPLEMENTED and (hint := tls.mismatch_hint(address, host, port,
                                                                                      PREFLIGHT_TIMEOUT_S)):
                raise ConnectionFailedError(hint) from None
            if code == grpc.StatusCode.UNIMPLEMENTED and _answers_as_gcs(host, port):
                gcs = ClusterAddress(host, port, driver=True).text
                msg = (f"{address} is the cluster's GCS port, not its Ray Client port. From a kernel on a node "
                       f"of the cluster, join it as a Ray driver: nbtrain.connect({gcs!r}); from elsewhere, "
                       f"give the head's Ray Client port: nbtrain.connect('ray://{host}:10001') "
                       f"(--ray-client-server-port, 10001 by default).")
                raise ConnectionFailedError(msg) from None
            msg = (f"Something is listening at {address}, but it does not answer as a Ray Client server "
                   f"({code.name}). Check the port: it must be the head's Ray Client port "
                   f"(--ray-client-server-port, 10001 by default), not the GCS or dashboard port.")
            raise ConnectionFailedError(msg) from None


def _answers_as_gcs(host: str, port: int) -> bool:
    """Whether ``host:port`` is a GCS (asked without a token: a GCS refuses that, which still says what it is)."""
    import grpc

    try:
        cluster_metadata(host, port, [], PREFLIGHT_TIMEOUT_S, tls.channel_credentials(f"{host}:{port}"))
    except grpc.RpcError as exc:
        return bool(exc.code() == grpc.StatusCode.UNAUTHENTICATED)
    return True


def _answers_as_client_server(host: str, port: int) -> bool:
    import grpc

    try:
        ping_client_server(host, port, [], PREFLIGHT_TIMEOUT_S, tls.channel_credentials(f"ray://{host}:{port}"))
    except grpc.RpcError as exc:
        return bool(exc.code() == grpc.StatusCode.UNAUTHENTICATED)
    return True


def versions_beside(target: ClusterAddress, token: str | None) -> dict[str, Any]:
    """What a Ray Client server's cluster runs, read at once from the GCS beside it, where the head keeps the
    default layout (Ray Client on 10001, the GCS on 6379: ``ray start --head``'s and KubeRay's) and its GCS
    answers from here; else ``{}``, quietly.

    Over Ray Client the cluster's versions are known only once the session's server has started on the head
    (2-3 s, measured); this says a mismatch before that. Only the default layout is read: on a head whose ports
    were changed, 6379 may well be another cluster's.
    """
    if target.driver or target.port != cluster_address.CLIENT_PORT:
        return {}
    gcs = ClusterAddress(target.host, cluster_address.GCS_PORT, driver=True)
    if not port_is_open(gcs.host, gcs.port, timeout=BESIDE_TIMEOUT_S):
        return {}
    import grpc

    try:
        return cluster_metadata(gcs.host, gcs.port, grpc_metadata(token), BESIDE_TIMEOUT_S,
                                tls.channel_credentials(gcs.text))
    except (grpc.RpcError, ConnectionFailedError):
        return {}


def preflight_gcs(target: ClusterAddress, token: str | None, *, source: str = "",
                  withheld: Sequence[str] = ()) -> dict[str, Any]:
    """What the cluster whose GCS is ``target`` runs (its ``ray_version`` and ``python_version``), read with
    ``token``; raises :class:`ConnectionFailedError` naming the cause when it will not take a driver."""
    address = target.text
    try:
        socket.getaddrinfo(target.host, target.port)
    except socket.gaierror:
        msg = f"Cannot resolve the host in {address}. Check the spelling of the head node's name."
        raise ConnectionFailedError(msg) from None
    if not port_is_open(target.host, target.port, timeout=PREFLIGHT_TIMEOUT_S):
        msg = (f"Nothing is listening at {address}. Check that the Ray head is running (`ray status` on the head) "
               f"and that {target.port} is its GCS port (`ray start --head --port={target.port}`, 6379 by default).")
        raise ConnectionFailedError(msg)
    import grpc

    try:
        return cluster_metadata(target.host, target.port, grpc_metadata(token), PREFLIGHT_TIMEOUT_S * 2,
                                tls.channel_credentials(address))
    except grpc.RpcError as exc:
        code = exc.code()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if token:
            origin = f" ({source})" if source else ""
            msg = (f"The cluster at {address} rejected the authentication token{origin}. Pass the cluster's "
                   f"token: nbtrain.connect({address!r}, token=...) or set RAY_AUTH_TOKEN (on the head: "
                   f"`ray get-auth-token`).")
        else:
            msg = (f"The cluster at {address} requires a token (RAY_AUTH_MODE=token) and none was given. Pass "
                   f"`token=` or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH (on the head: `ray get-auth-token`).")
            if withheld:
                msg += (" Not sent, because nbtrain sends a cluster's token only to that cluster: "
                        + "; ".join(withheld) + ".")
        raise ConnectionFailedError(msg)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and (
            hint := tls.mismatch_hint(address, target.host, target.port, PREFLIGHT_TIMEOUT_S)):
        raise ConnectionFailedError(hint)
    if code == grpc.StatusCode.UNIMPLEMENTED and _answers_as_client_server(target.host, target.port):
        client = ClusterAddress(target.host, target.port, driver=False).text
        msg = (f"{address} is a Ray Client port, not the cluster's GCS: connect over Ray Client with "
               f"nbtrain.connect({client!r}), or, from a kernel on a node of the cluster, give its GCS "
               f"address (`ray start --head --port`, 6379 by default) to join it as a Ray driver.")
        raise ConnectionFailedError(msg)
    msg = (f"Something is listening at {address}, but it does not answer as a Ray GCS ({code.name}). Check the "
           f"port: a kernel on the cluster joins it at its GCS port (6379 by default); over Ray Client the "
           f"address is ray://host:10001.")
    raise ConnectionFailedError(msg)
