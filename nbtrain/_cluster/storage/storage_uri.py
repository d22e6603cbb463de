"""Where ``storage=`` keeps checkpoints: a directory path, or a URI that ``pyarrow.fs`` opens.

A *location* here is an absolute local path — a directory every node reaches, on a
shared file system — or a URI of a remote file system or object store that
``pyarrow.fs.FileSystem.from_uri`` opens: ``s3://bucket/prefix``, ``gs://`` (``gcs://``),
``hdfs://`` (``viewfs://``), ``abfs://`` (``abfss://``). A ``file://`` URI is its path:
:func:`normalise` turns it into one when the option is given, so the rest of nbtrain
sees paths and remote URIs only.

With a path, ``storage=`` holds the run's whole directory, as it always did: history,
state and checkpoints. With a remote URI the history and state stay in nbtrain's home
on the head node (append-only segments with fsync are not for object stores), and only
checkpoints go to ``<uri>/<run>/checkpoints/``, written and read through pyarrow.fs by
the rank that saves, the ranks that restart, the supervisor (keep-last-N, delete) and
the notebook (``run.load_checkpoint()``). Every one of those processes needs the store's
credentials (pyarrow reads the usual environment variables and config files; the ranks
get variables with ``env=``), or the URI carries them (``s3://KEY:SECRET@bucket/...``).

Each function takes a location of either kind: paths go through ``os`` (private modes,
atomic renames, as before), URIs through pyarrow.fs. Nothing contacts a server until a
function that reads or writes is called, and a remote failure is a :class:`StorageError`
that names ``storage (--storage)``, the URI (its secrets masked) and what to check.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from nbtrain._exceptions import StorageError
from nbtrain._paths import private_dir, write_atomic

# The schemes ``pyarrow.fs.FileSystem.from_uri`` opens across processes (its ``mock://`` lives in one process).
REMOTE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SECRET_QUERY = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)


def scheme_of(value: str) -> str | None:
    """``"s3"`` for ``"s3://bucket/x"``; None for a path."""
    match = _SCHEME.match(value)
    return match.group(1) if match else None


def normalise(value: str) -> str | None:
    """``value`` as nbtrain keeps it: an absolute path (a ``file://`` URI's too) or a remote URI; None if neither.

    Only the scheme's name is checked: no server is contacted. Example::

        normalise("file:///mnt/ckpt") == "/mnt/ckpt"; normalise("s3://bucket/runs") == "s3://bucket/runs"
        normalise("ckpt") is None; normalise("ftp://host/x") is None
    """
    scheme = scheme_of(value)
    if scheme is None:
        return value if os.path.isabs(value) else None
    if scheme in REMOTE_SCHEMES:
        return value
    if scheme == "file":
        parts = urlsplit(value)
        path = unquote(parts.path)
        if parts.netloc in ("", "localhost") and not parts.query and os.path.isabs(path):
            return path
    return None


def is_remote(location: str) -> bool:
    """Whether ``location`` (normalised) is reached through pyarrow.fs rather than the local file system."""
    return scheme_of(location) is not None


def local_storage(storage: str | None) -> str | None:
    """``storage=`` when it is a directory path (it holds the run's whole directory); None for a URI or none."""
    return storage if storage and not is_remote(storage) else None


def remote_storage(storage: str | None) -> str | None:
    """``storage=`` when it is a pyarrow.fs URI (it holds only checkpoints); None for a path or none."""
    return storage if storage and is_remote(storage) else None


def shown(location: str) -> str:
    """``location`` for messages and events: a URI's user, password and secret-looking query values masked."""
    if not is_remote(location):
        return location
    parts = urlsplit(location)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = urlencode([(key, "***" if _SECRET_QUERY.search(key) else value)
                       for key, value in parse_qsl(parts.query, keep_blank_values=True)], safe="*:")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def join(location: str, *names: str) -> str:
    """``location``/``names``: under a URI's path, before its query (``s3://b/p?region=x`` -> ``s3://b/p/n?region=x``)."""
    if not is_remote(location):
        return os.path.join(location, *names)
    parts = urlsplit(location)
    return urlunsplit(parts._replace(path="/".join([parts.path.rstrip("/"), *names])))


def split(location: str) -> tuple[str, str]:
    """The directory holding ``location``, and its name."""
    if not is_remote(location):
        return os.path.dirname(location), os.path.basename(location)
    parts = urlsplit(location)
    directory, name = posixpath.split(parts.path.rstrip("/"))
    return urlunsplit(parts._replace(path=directory)), name


@functools.lru_cache(maxsize=32)
def _open_directory(directory: str) -> tuple[Any, str]:
    """pyarrow's file system and path for a remote directory (kept: an S3 URI without a region costs a request)."""
    import pyarrow.fs

    with _explained(directory, "opening it"):
        filesystem, path = pyarrow.fs.FileSystem.from_uri(directory)
    return filesystem, str(path)


def _resolve(location: str) -> tuple[Any, str]:
    """The file system and path of a remote ``location``, through its directory's (cached) file system."""
    directory, name = split(location)
    filesystem, path = _open_directory(directory)
    return filesystem, f"{path.rstrip('/')}/{name}" if name else path


@contextlib.contextmanager
def _explained(location: str, doing: str) -> Iterator[None]:
    """A pyarrow failure on ``location`` as a :class:`StorageError` saying what to check."""
    try:
        yield
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError, its IO errors OSErrors
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300].rstrip(".")
        msg = (f"storage (--storage) {shown(location)}: {doing} failed: {detail}. Check that every node and the "
               f"notebook have the credentials for it (pyarrow.fs reads the usual environment variables and config "
               f"files; pass variables to the ranks with env=), that the bucket or path exists, and that pyarrow "
               f"there supports {scheme_of(location)}:// — or give storage= a directory every node reaches.")
        raise StorageError(msg) from None


def write_bytes(location: str, data: bytes) -> None:
    """Write ``data`` to the file at ``location`` whole: readers see the old file or the new one, never part."""
    if not is_remote(location):
        write_atomic(Path(location), data, durable=True)
        return
    with _explained(location, "writing"):
        _put(*_resolve(location), data)


def _put(filesystem: Any, path: str, data: bytes) -> None:
    filesystem.create_dir(posixpath.dirname(path), recursive=True)
    with filesystem.open_output_stream(path) as stream:  # an object appears whole when the stream closes
        stream.write(data)


def read_bytes(location: str) -> bytes:
    if not is_remote(location):
        return Path(location).read_bytes()
    with _explained(location, "reading"):
        filesystem, path = _resolve(location)
        with filesystem.open_input_stream(path) as stream:
            data: bytes = stream.read()
            return data


def upload(local_dir: str | Path, location: str) -> None:
    """Copy the files under ``local_dir`` into the remote directory ``location`` (files of the same name replaced)."""
    import pyarrow.fs

    with _explained(location, "uploading"):
        filesystem, path = _resolve(location)
        filesystem.create_dir(path, recursive=True)
        pyarrow.fs.copy_files(str(local_dir), path, source_filesystem=pyarrow.fs.LocalFileSystem(),
                              destination_filesystem=filesystem)


def download(location: str, into: str | Path) -> Path:
    """Copy the remote directory ``location`` and everything under it into the local directory ``into``."""
    import pyarrow.fs

    directory = private_dir(Path(into))
    with _explained(location, "downloading"):
        filesystem, path = _resolve(location)
        pyarrow.fs.copy_files(path, str(directory), source_filesystem=filesystem,
                              destination_filesystem=pyarrow.fs.LocalFileSystem())
    return directory


@contextlib.contextmanager
def local_copy(location: str) -> Iterator[str]:
    """The directory ``location`` as a local path: itself, or a temporary download removed afterwards."""
    if not is_remote(location):
        yield location
        return
    with tempfile.TemporaryDirectory(prefix="nbtrain-ckpt-") as directory:
        yield str(download(location, directory))


def list_names(directory: str) -> list[str]:
    """The names of the files and directories directly in ``directory`` (none if it is missing)."""
    if not is_remote(directory):
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []
    import pyarrow.fs

    with _explained(directory, "listing"):
        filesystem, path = _resolve(directory)
        return [info.base_name for info in filesystem.get_file_info(pyarrow.fs.FileSelector(path,
                                                                                            allow_not_found=True))]


def delete(location: str) -> None:
    """Remove the file or directory (with everything under it) at ``location``; a missing one is fine."""
    if not is_remote(location):
        if os.path.isdir(location) and not os.path.islink(location):
            shutil.rmtree(location)
        else:
            Path(location).unlink(missing_ok=True)
        return
    import pyarrow.fs

    with _explained(location, "deleting"):
        filesystem, path = _resolve(location)
        kind = filesystem.get_file_info(path).type
        if kind == pyarrow.fs.FileType.Directory:
            filesystem.delete_dir(path)
        elif kind == pyarrow.fs.FileType.File:
            filesystem.delete_file(path)


def probe(location: str) -> None:
    """Write and delete one empty file in the remote directory ``location``; a :class:`StorageError` if it fails."""
    with _explained(location, "writing a test file"):
        filesystem, path = _resolve(join(location, f".nbtrain-probe-{os.getpid()}-{os.urandom(3).hex()}"))
        _put(filesystem, path, b"")
        filesystem.delete_file(path)
