"""Where nbtrain keeps its local state: ``$NBTRAIN_HOME``, else ``~/.nbtrain``.

The one place every process (notebook kernel, CLI and agent, Jupyter server,
the embedded cluster's supervisors) finds the home directory and the files in
it, so tests and users with several setups move everything with one variable::

    runs/<name>.json       the run registry (written at launch; see _registry)
    cluster.json           the cluster a notebook last connected to
    cluster/               the embedded local cluster: state, token, start log, start lock
    cluster/cwd/           the working directory of the embedded cluster's processes
    ray/                   the embedded cluster's Ray temp dir (sessions, logs, Unix sockets)
    storage/<run>/         a run's history and checkpoints (supervisor side)
    run-index/<run>.json   where each run on this head keeps its files (a finished run has no process)

Reading functions never create anything; writers create what they write.
Everything here is the user's alone (tokens, metrics, checkpoints): directories
are 0700 and files 0600, set explicitly where each is created (never through the
process umask, which would change the kernel's), and a home left with looser
modes is tightened the next time nbtrain writes to it.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

from nbtrain import _json


def nbtrain_home() -> Path:
    # absolute: the embedded cluster's processes run in a folder of their own (local_cluster.process_folder)
    return Path(os.environ.get("NBTRAIN_HOME") or Path.home() / ".nbtrain").absolute()


def runs_dir(home: Path | None = None) -> Path:
    return (home or nbtrain_home()) / "runs"


def cluster_file(home: Path | None = None) -> Path:
    return (home or nbtrain_home()) / "cluster.json"


def local_cluster_dir() -> Path:
    return nbtrain_home() / "cluster"


def local_cluster_workdir() -> Path:
    return local_cluster_dir() / "cwd"


def ray_temp_dir() -> Path:
    return nbtrain_home() / "ray"


def storage_root() -> Path:
    return nbtrain_home() / "storage"


def sweeps_dir() -> Path:
    """On the head node: each sweep's record and Ray Tune's own experiment files."""
    return nbtrain_home() / "sweeps"


def run_index_dir(home: Path | None = None) -> Path:
    return (home or nbtrain_home()) / "run-index"


def checkpoints_dir() -> Path:
    """Where the notebook puts checkpoint files it fetched from the cluster (``run.checkpoint_dir()``)."""
    return nbtrain_home() / "checkpoints"


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def _make_private(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` if it is ours and looser (a directory someone else owns is left alone)."""
    info = path.stat()
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != mode:
        path.chmod(mode)


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents owner-only (0700), and tighten ``path`` itself.

    Under ``$NBTRAIN_HOME`` the home and every directory down to ``path`` are
    tightened too; outside it (a ``storage=`` path) existing parents are the
    user's and keep their modes.
    """
    path = Path(path)
    made = []
    probe = path
    while not probe.exists() and probe.parent != probe:
        made.append(probe)
        probe = probe.parent
    for directory in reversed(made):
        try:
            directory.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another process made it between our check and now
            pass
    home = nbtrain_home()
    ours = {path, *made}
    if path.is_relative_to(home):
        ours.update(home.joinpath(*path.relative_to(home).parts[:n])
                    for n in range(len(path.relative_to(home).parts) + 1))
    for directory in ours:
        _make_private(directory, PRIVATE_DIR)
    return path


def private_opener(path: str, flags: int) -> int:
    """``open(..., opener=private_opener)``: a new file is created 0600, an existing one is tightened to 0600."""
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        info = os.fstat(fd)
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` as the file ``path`` whole: readers see the old file or the new one, never part.

    Every atomic write in nbtrain goes through here, with one policy: the file is 0600 in a 0700
    directory (see the module docstring), also when it replaces an older, looser one; the temporary
    name is unique per process and thread (the supervisor writes from several threads) and removed
    if the write fails. ``durable=True`` is for what the run cannot make again after a crash of the
    machine (checkpoints, the run's state, its spec, its final files): the file is fsynced before
    the rename and its directory after it, so the new name and its content survive together.
    """
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb", opener=private_opener) as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` durable (a crash of the machine could otherwise lose a new file)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, *, durable: bool = False) -> None:
    """Readers (the lab sidebar, another kernel) never see a half-written file; strict JSON (see _json).

    Written by :func:`write_atomic`, whose policy it follows.
    """
    write_atomic(path, _json.dumps(data, indent=1).encode("utf-8"), durable=durable)


def read_json(path: Path) -> Any | None:
    try:
        return _json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
