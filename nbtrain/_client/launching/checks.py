"""The single checks and steps :mod:`.starting` is made of: the function's signature, the upload of
``runtime_env``'s local folders, a writable ``storage=``, the spec as bytes, the supervisor's start and its
constructor's error, the name an ended run's name gives (``NAME-2``) and what is said of it.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import os
import re
import socket
import tempfile
from collections.abc import Callable
from typing import Any

from nbtrain._client.launching.serialization import check_values
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.storage import storage_uri
from nbtrain._exceptions import NbtrainError, StorageError
from nbtrain._options import NAME_MAX_LENGTH, RunOptions
from nbtrain._packing import code_origin
from nbtrain._packing.runtime_env import local_paths

SUPERVISOR_START_S = 30.0  # launch() waits this long for the run's supervisor to take up its storage


def with_uploaded_paths(options: RunOptions) -> RunOptions:
    """``options`` whose runtime_env names, instead of the notebook machine's folders, their copies uploaded
    to the cluster (see _ray_compat.upload_local_paths)."""
    from nbtrain._ray_compat import upload_local_paths

    if not local_paths(options.runtime_env):
        return options
    try:
        return dataclasses.replace(options, runtime_env=upload_local_paths(options.runtime_env or {}))
    except (OSError, ValueError) as exc:
        msg = (f"runtime_env: its working_dir or py_modules could not be sent to the cluster: {exc}. Exclude large "
               "files with runtime_env['excludes'], or put them in storage the cluster reads.")
        raise NbtrainError(msg) from None


def name_taken(name: str, address: str, state: str | None = None) -> str:
    """Why ``name`` cannot be had: a live run holds it (``state``, as ``launch()`` says it), or any run does
    (``run.fork()``, which numbers no names)."""
    if state is not None:
        return (f"Run {name!r} is still going on {address} ({state}): a live run's name is its own. Pick another "
                f"name, or attach to it with nbtrain.attach({name!r}) (run.stop() ends it; launching an ended run's "
                f"name again starts a new run, {name}-2).")
    return (f"A run named {name!r} already exists on {address}. Pick another name, "
            f"continue it from its latest checkpoint with resume=True (%%ray_train --resume), "
            f"attach to it with nbtrain.attach({name!r}), or delete it with nbtrain.attach({name!r}).delete().")


def numbered_name(name: str, taken: set[str]) -> str:
    """The first of ``NAME-2``, ``NAME-3``… not in ``taken``: a new run (or sweep) under an ended one's name. A name
    near the length limit gives up its last characters to the number, so the new name is still a valid one."""
    numbered = (name[:NAME_MAX_LENGTH - len(f"-{n}")] + f"-{n}" for n in itertools.count(2))
    return next(candidate for candidate in numbered if candidate not in taken)


def ended_note(asked: str, name: str, kind: str = "run") -> str:
    """The line said when a launch under an ended run's (or sweep's) name starts ``name`` instead."""
    again = "resume=True (%%ray_train --resume) continues the old one" if kind == "run" else \
        f"nbtrain.attach_sweep({asked!r}) reads the old one"
    return f"{asked!r} is an ended {kind} (kept); this {kind} is {name!r}. {again}."


def check_writable(storage: str) -> None:
    """Refuse at once a ``storage=`` directory that cannot be created or written (one probe file).

    A pyarrow.fs URI gets the same probe through pyarrow.fs (one small write and delete):
    ``launch()`` makes it on the embedded cluster, whose processes share the notebook's
    credentials; elsewhere the notebook's view proves nothing and a failing write names
    ``storage`` at the run's first checkpoint.
    """
    if storage_uri.is_remote(storage):
        storage_uri.probe(storage)
        return
    try:
        os.makedirs(storage, exist_ok=True)
        with tempfile.TemporaryFile(dir=storage):
            pass
    except OSError as exc:
        msg = (f"storage (--storage) must be a directory the cluster can write, but {storage!r} cannot be "
               f"written: {exc.strerror or exc}. Pick another directory, or fix its permissions.")
        raise StorageError(msg) from None


def wait_for_supervisor(handle: Any, name: str, ended: Callable[[], bool] = lambda: False) -> None:
    """Wait until the run's supervisor has taken up its storage; raise its reason if it could not.

    Ray keeps an actor's constructor error in its death cause; nbtrain's own errors (a
    :class:`StorageError` naming the directory) come back as raised, and no run is left behind.
    A supervisor that is gone without such an error may have run its whole run already (warm ranks, a
    short function) and exited, as a finished run's supervisor does: ``ended()`` says whether its files
    say so, and then the run is read from them as any finished run is.
    """
    import ray

    try:
        ray.get(handle.summary.remote(), timeout=SUPERVISOR_START_S)
    except ray.exceptions.GetTimeoutError:
        return  # a slow head node: the run is on its way, and reading it waits as usual
    except ray.exceptions.RayActorError as exc:
        cause = _constructor_error(exc)
        if cause is None and ended():
            return
        ray.kill(handle, no_restart=True)
        if cause is not None:
            raise cause from None
        msg = f"Run {name!r} could not start its supervisor on the cluster: {exc}"
        raise NbtrainError(msg) from None


def _constructor_error(exc: Exception) -> NbtrainError | None:
    """The nbtrain error a supervisor's constructor raised, from Ray's actor-died error.

    Over Ray Client the cause arrives only as the remote traceback's text, whose last
    ``nbtrain._exceptions.<Name>: <message>`` line names it.
    """
    from nbtrain import _exceptions

    found = list(re.finditer(r"^nbtrain\._exceptions\.(\w+): ", str(exc), re.MULTILINE))
    if not found:
        return None
    kind = getattr(_exceptions, found[-1].group(1), None)
    if not (isinstance(kind, type) and issubclass(kind, NbtrainError)):
        return None
    return kind(str(exc)[found[-1].end():].strip())


def pickled(spec: RunSpec) -> bytes:
    """The spec as bytes; an unpicklable config value is named (``config['key']``)."""
    try:
        return code_origin.dumps(spec)  # a config may hold functions: they keep their origin too
    except Exception:
        check_values({f"config[{key!r}]": value for key, value in (spec.options.config or {}).items()})
        raise


def check_signature(train_fn: object) -> bool:
    """Whether ``train_fn`` takes the config; refuses a function that needs more than one argument."""
    if not callable(train_fn):
        msg = f"train_fn must be a function, got {type(train_fn).__name__}."
        raise NbtrainError(msg)
    try:
        signature = inspect.signature(train_fn)
    except (TypeError, ValueError):
        return True
    required = [p for p in signature.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if len(required) > 1:
        names = ", ".join(p.name for p in required)
        msg = (f"train_fn must take one argument (the config dict) or none, but "
               f"{getattr(train_fn, '__name__', 'it')}({names}) needs {len(required)}. "
               f"Read extra values from config instead: def train(config): ...")
        raise NbtrainError(msg)
    return bool(positional)


def owner() -> dict[str, Any]:
    return {"notebook": os.environ.get("JPY_SESSION_NAME"), "host": socket.gethostname(), "pid": os.getpid()}
