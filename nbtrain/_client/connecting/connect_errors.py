"""What a failed connection says: Ray's errors on connecting, turned into one that says what to do."""

from __future__ import annotations

import re
from pathlib import Path

from nbtrain._client.connecting import version_check
from nbtrain._client.connecting.version_check import check_ray_supported
from nbtrain._exceptions import ConnectionFailedError, VersionMismatchError


def explain(address: str, exc: Exception, local_temp_dir: str | None = None) -> Exception:
    """The error to raise for ``exc``, Ray's failure to connect to ``address``: a version mismatch names both
    versions and what to install; a driver off the cluster is sent to Ray Client; else Ray's words, with the end of
    the session server's log when the cluster is ours to read (``local_temp_dir``)."""
    text = str(exc)
    cluster_ray = re.search(r"cluster was started with:\s*Ray: (\S+)", text)
    if cluster_ray:
        try:
            check_ray_supported(cluster_ray.group(1), "cluster")
        except VersionMismatchError as too_old:
            return too_old
    cluster_python = re.search(r"cluster was started with:\s*Ray: \S+\s*Python: (\S+)", text)
    if cluster_ray and cluster_python:
        try:
            version_check.check_against_notebook({"ray": cluster_ray.group(1), "python": cluster_python.group(1)})
        except VersionMismatchError as differs:
            return differs
    if "version" in text.lower() and ("mismatch" in text.lower() or "differ" in text.lower()):
        mine = version_check.notebook_versions()
        return VersionMismatchError(
            f"Ray refused the connection to {address} because versions differ: {text}. "
            f"This notebook has Python {mine['python']} and Ray {mine['ray']}; "
            f"install the cluster's versions in the notebook's environment (or vice versa).")
    if "://" not in address and ("expects this IP address" in text or "raylet" in text.lower()):
        return ConnectionFailedError(
            f"Could not join {address} as a Ray driver: {type(exc).__name__}: {text.splitlines()[0] if text else ''}. "
            f"A driver must run on a node of the cluster; from another machine connect over Ray Client: "
            f"nbtrain.connect('ray://<head>:10001').")
    message = f"Could not connect to {address}: {type(exc).__name__}: {text}"
    server_log = _client_server_log(text, local_temp_dir)
    if server_log:
        message += f"\nThe end of that server's log:\n{server_log}"
    return ConnectionFailedError(message)


def _client_server_log(error_text: str, local_temp_dir: str | None) -> str:
    """The tail of the per-session server log Ray's error names, when the cluster is ours to read."""
    match = re.search(r"(ray_client_server_\d+)\.err", error_text)
    if not match or not local_temp_dir:
        return ""
    logs = Path(local_temp_dir) / "session_latest" / "logs"
    lines: list[str] = []
    for path in sorted(logs.glob(f"{match.group(1)}*")):
        try:
            lines += [f"  {path.name}: {line}" for line in path.read_text(errors="replace").splitlines()[-15:]]
        except OSError:
            continue
    return "\n".join(lines)

