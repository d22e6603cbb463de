"""What the embedded cluster's ``local.json`` records, and whether to trust it.

Two checks before a recorded head is used: that its pid is still our ``ray
start --head`` (a pid alone proves nothing after a reboot), and that it was
started by the same Python environment as the caller (the head's workers import
the nbtrain of the environment that started it).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from nbtrain._exceptions import VersionMismatchError
from nbtrain._net import LOOPBACK
from nbtrain._version import __version__

# A notebook on this machine joins the embedded cluster as a Ray driver of its GCS, not over its Ray Client
# server: benchmarks/connect_modes.py measured it 2.5-3.6x sooner to connect, with no session server on the
# head (167 MB per notebook), the feed, launch and restarts the same. The Ray Client way stays reachable by
# its `address` and tested (tests/test_connect_driver.py).
NOTEBOOKS_JOIN_AS_DRIVER = True


@dataclasses.dataclass
class LocalClusterInfo:
    pid: int
    gcs_port: int
    client_port: int
    token_path: str
    temp_dir: str
    num_cpus: int
    num_gpus: int
    started: float
    # the environment that started the head, which its ranks run (see check_environment)
    python: str = ""
    prefix: str = ""
    nbtrain_version: str = ""
    nbtrain_location: str = ""

    @classmethod
    def from_record(cls, data: Any) -> LocalClusterInfo | None:
        """The info in a ``local.json`` record, or ``None`` if it is not one."""
        if not isinstance(data, dict):
            return None
        known = {field.name for field in dataclasses.fields(cls)}
        try:
            return cls(**{key: value for key, value in data.items() if key in known})
        except TypeError:
            return None

    @property
    def address(self) -> str:
        return f"ray://{LOOPBACK}:{self.client_port}"

    @property
    def gcs_address(self) -> str:
        return f"{LOOPBACK}:{self.gcs_port}"

    @property
    def connect_address(self) -> str:
        """The address a notebook on this machine connects with (``connect()``, ``nbtrain lab``'s kernels)."""
        return self.gcs_address if NOTEBOOKS_JOIN_AS_DRIVER else self.address

    @property
    def addresses(self) -> tuple[str, str]:
        """Both ways to it, :attr:`connect_address` first: a run launched either way belongs to this cluster."""
        other = self.address if self.connect_address == self.gcs_address else self.gcs_address
        return (self.connect_address, other)


def _command_line(pid: int) -> list[str]:
    """The arguments ``pid`` runs with, or ``[]`` if there is no such process."""
    if Path("/proc/self").exists():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return []
        return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]
    try:  # no /proc (macOS)
        found = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return []
    return found.stdout.split()


def is_our_head(info: LocalClusterInfo) -> bool:
    """Whether ``info.pid`` is this home's head: ``ray start --head`` with our temp dir and client port.

    A pid alone proves nothing after a reboot (or a crash long ago): it may be
    anyone's process now, which we must neither trust nor signal.
    """
    args = _command_line(info.pid)
    return ("start" in args and "--head" in args and f"--temp-dir={info.temp_dir}" in args
            and f"--ray-client-server-port={info.client_port}" in args)


_ENVIRONMENT_WORDS = {"python": "Python executable", "prefix": "sys.prefix",
                      "nbtrain_version": "nbtrain version", "nbtrain_location": "nbtrain location"}


def _same_path(key: str, value: str) -> str:
    return os.path.realpath(value) if key in ("prefix", "nbtrain_location") and value else value


def this_environment() -> dict[str, str]:
    """What a head records about the environment that starts it (keys: LocalClusterInfo's fields)."""
    return {"python": sys.executable, "prefix": sys.prefix, "nbtrain_version": __version__,
            "nbtrain_location": str(Path(__file__).resolve().parents[2])}


# What makes an environment: the executable is only how it was named (`python`, `python3` and
# `venv/bin/python3.11` run the same environment), so it is shown but not compared.
_COMPARED = ("prefix", "nbtrain_version", "nbtrain_location")


def check_environment(info: LocalClusterInfo) -> None:
    """Refuse a head started by another Python environment: its ranks would run that environment's nbtrain."""
    here = this_environment()
    there = {key: str(getattr(info, key)) for key in here}
    differing = [key for key in _COMPARED if _same_path(key, here[key]) != _same_path(key, there[key])]
    if not differing:
        return
    differs = ", ".join(_ENVIRONMENT_WORDS[key] for key in differing)

    def describe(env: dict[str, str]) -> str:
        return (f"Python {env['python'] or '?'} (sys.prefix {env['prefix'] or '?'}), "
                f"nbtrain {env['nbtrain_version'] or '?'} from {env['nbtrain_location'] or '?'}")

    msg = (f"The local Ray cluster at {info.connect_address} (pid {info.pid}) was started from another environment "
           f"(different {differs}), so its workers would run that environment's nbtrain, not this notebook's.\n"
           f"  the cluster runs:  {describe(there)}\n"
           f"  this notebook runs: {describe(here)}\n"
           "Stop it with `nbtrain cluster stop` (this ends the runs on it) and connect again to start one "
           "from this environment, or give this environment its own cluster with another NBTRAIN_HOME.")
    raise VersionMismatchError(msg)
