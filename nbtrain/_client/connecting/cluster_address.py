"""What an address given to ``connect()`` names, decided before anything is sent.

- ``ray://host:port`` is a Ray Client server (the head's, 10001 unless changed): the notebook may run
  anywhere that reaches it.
- ``host:port`` (``host`` alone: port 6379) is the cluster's GCS, which the notebook joins as a Ray
  driver, as ``ray.init("host:port")`` does: the kernel runs on a node of the cluster (JupyterLab on the
  head, a KubeRay or Anyscale workspace), and no Ray Client server stands between it and its runs.
- ``auto`` is the cluster on this node, found as ``ray.init("auto")`` finds it: ``$RAY_ADDRESS``, else the
  address the last ``ray start --head`` on this machine recorded in Ray's temp dir
  (``$RAY_TMPDIR``, ``$TMPDIR`` or ``/tmp``, then ``ray/ray_current_cluster``). Ray itself would then
  also look for any GCS process on the machine; nbtrain does not, so that ``auto`` names one cluster
  or says at once that there is none.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import port_is_open

CLIENT_PORT = 10001  # Ray Client's default
GCS_PORT = 6379  # the GCS's default (`ray start --head --port`)
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclasses.dataclass(frozen=True)
class ClusterAddress:
    """Where a cluster is, and how the notebook joins it: as a Ray ``driver`` (a GCS address), or over Ray Client."""

    host: str
    port: int
    driver: bool

    @property
    def text(self) -> str:
        """As the user writes it (and the registry and ``Cluster.address`` keep it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.driver else f"ray://{host}:{self.port}"

    @property
    def mode(self) -> str:
        return "as a Ray driver" if self.driver else "over Ray Client"

    @property
    def node_ip_address(self) -> str | None:
        """This process's address on the cluster when it is a driver of a cluster bound to loopback."""
        return "127.0.0.1" if self.driver and self.host in _LOOPBACK_HOSTS else None


def parse(address: str) -> ClusterAddress:
    """``ray://host[:port]`` (Ray Client) or ``host[:port]`` (a GCS), checked for form only."""
    text = address.strip()
    driver = "://" not in text
    parsed = urlparse(text if not driver else f"gcs://{text}")
    if not driver and parsed.scheme != "ray":
        msg = (f"{address!r} is not an address nbtrain connects to: give ray://host:10001 (the head's Ray Client "
               f"port, from anywhere), host:6379 (the cluster's GCS, from a kernel on one of its nodes, as a Ray "
               f"driver), 'auto' (the cluster on this node) or nothing (the embedded local cluster).")
        raise ConnectionFailedError(msg)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if not parsed.hostname or port == -1 or parsed.path not in ("", "/"):
        example = "ray://head:10001" if not driver else "head:6379"
        msg = f"Cannot read a host and port in {address!r}; write it like {example!r}."
        raise ConnectionFailedError(msg)
    return ClusterAddress(parsed.hostname, port or (GCS_PORT if driver else CLIENT_PORT), driver)


def address_file() -> Path:
    """Where ``ray start --head`` (without ``--temp-dir``) records its GCS address on this machine."""
    if "RAY_TMPDIR" in os.environ:
        system = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        system = os.environ["TMPDIR"]
    else:
        system = "/tmp"
    return Path(system) / "ray" / "ray_current_cluster"


def on_this_node() -> ClusterAddress:
    """The cluster ``"auto"`` names (see the module's docstring), once something listens there."""
    from_env = os.environ.get("RAY_ADDRESS", "").strip()
    if from_env and from_env.lower() not in ("auto", "local", "auto-local"):
        found, source = parse(from_env), f"$RAY_ADDRESS ({from_env})"
    else:
        path = address_file()
        try:
            recorded = path.read_text().strip()
        except OSError:
            recorded = ""
        if not recorded:
            msg = (f"connect('auto') found no Ray cluster on this node: $RAY_ADDRESS is not set and {path} "
                   f"(where `ray start --head` records its address) does not exist. Start one with "
                   f"`ray start --head`, name one: nbtrain.connect('head:6379') from a node of it, "
                   f"nbtrain.connect('ray://head:10001') from elsewhere, or call nbtrain.connect() for the "
                   f"embedded local cluster.")
            raise ConnectionFailedError(msg)
        found, source = parse(recorded), f"{path} ({recorded})"
    if found.driver and not port_is_open(found.host, found.port, timeout=1.0):
        msg = (f"connect('auto') found {source}, but nothing listens at {found.text}: that cluster has stopped. "
               f"Start it again (`ray start --head`) or name a running one: nbtrain.connect('host:6379').")
        raise ConnectionFailedError(msg)
    return found
