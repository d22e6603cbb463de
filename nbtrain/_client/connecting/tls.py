"""Ray's own TLS for Ray Client, as the notebook's side sees it: ``RAY_USE_TLS`` and its three files.

A cluster started with ``RAY_USE_TLS=1`` (and ``RAY_TLS_SERVER_CERT``, ``RAY_TLS_SERVER_KEY``,
``RAY_TLS_CA_CERT``) speaks TLS on every gRPC port, its Ray Client server included, and asks each
client for a certificate signed by that CA. Ray Client in the kernel uses TLS when the same
variables are set in the kernel's environment (Ray 2.60 reads them at each ``ray.init``); the
notebook's certificate is then the one ``RAY_TLS_SERVER_CERT`` names. This module gives
nbtrain's own check before ``ray.init`` (:func:`nbtrain._client.connecting.auth.preflight`) the same
channel, and tells the two ways of getting it wrong apart: TLS on one side only, and files that
are missing. The variables are Ray's documented configuration; nothing here is Ray internals.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any

from nbtrain._exceptions import ConnectionFailedError

USE_TLS = "RAY_USE_TLS"
TLS_FILES = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")  # the certificate, its key, the CA


def tls_on() -> bool:
    """Whether Ray Client in this process will use TLS (Ray's own test of the variable)."""
    return os.environ.get(USE_TLS, "0").lower() in ("1", "true")


def channel_credentials(address: str) -> Any:
    """The gRPC credentials Ray Client will use for ``address``, or None where TLS is off.

    Raises :class:`ConnectionFailedError` naming the variable when TLS is on and a file is not
    set or cannot be read (Ray's own error for it is a RuntimeError from deep inside ``ray.init``).
    """
    if not tls_on():
        return None
    import grpc

    contents = []
    for variable in TLS_FILES:
        path = os.environ.get(variable)
        if not path:
            msg = (f"Cannot connect to {address} over TLS: {USE_TLS} is on in this kernel's environment but "
                   f"{variable} is not set. Set all of {', '.join(TLS_FILES)} (this machine's certificate, its "
                   f"key, and the CA that signed the cluster's), or unset {USE_TLS} for a cluster without TLS.")
            raise ConnectionFailedError(msg)
        try:
            with open(path, "rb") as file:
                contents.append(file.read())
        except OSError as exc:
            msg = f"Cannot connect to {address} over TLS: {variable}={path} cannot be read ({exc.strerror})."
            raise ConnectionFailedError(msg) from None
    certificate, key, authority = contents
    return grpc.ssl_channel_credentials(root_certificates=authority, private_key=key, certificate_chain=certificate)


def server_speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether the server at ``host:port`` completes a TLS handshake (its certificate is not checked).

    Only to say what is wrong once the real check failed: a plaintext client's first bytes are
    not a TLS hello, so a TLS server just closes the connection, which reads like a wrong port.
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            return True
    except ssl.SSLError as exc:  # a TLS alert (no client certificate, say) is a TLS server's answer
        return "ALERT" in str(exc.reason or "")
    except OSError:
        return False


def mismatch_hint(address: str, host: str, port: int, timeout_s: float) -> str:
    """What to tell a user whose ping found no Ray Client server, when TLS is the likely cause ("" if not)."""
    speaks_tls = server_speaks_tls(host, port, timeout_s)
    if speaks_tls and not tls_on():
        return (f"The server at {address} speaks TLS (the cluster runs with {USE_TLS}=1): set {USE_TLS}=1 and "
                f"{', '.join(TLS_FILES)} in this kernel's environment (a certificate the cluster's CA signed, its "
                f"key, and that CA), then connect again.")
    if tls_on() and not speaks_tls:
        return (f"This kernel has {USE_TLS}=1 but the server at {address} does not speak TLS: unset {USE_TLS} "
                f"in the kernel's environment, or start the cluster with TLS.")
    if tls_on():
        return (f"The TLS handshake with {address} failed: the cluster's certificate must be signed by "
                f"{TLS_FILES[2]} and name {host}, and this kernel's ({TLS_FILES[0]}) must be signed by the CA "
                f"the cluster trusts.")
    return ""
