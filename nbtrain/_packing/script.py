"""A Python script run on every rank as ``torchrun`` runs it: as ``__main__``, with its own ``sys.argv``.

``nbtrain.launch_script("train.py", args=[...])`` and ``%ray_train --workers 2 train.py ...`` send the
script with the files of its folder (its helper modules, small config files), as notebook modules
travel (:mod:`.shipping`): a rank unpacks them into a folder named by their content hash, puts that
folder first on ``sys.path`` (so ``from datautils import ...`` finds the script's neighbour, this
version of it), sets ``sys.argv`` to ``[script, *args]`` and runs the file as ``__main__`` with
``runpy``. torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...) is
the rank's already, and the working directory is the run's (:mod:`nbtrain._cluster.working_folder`): files
the script writes relative to it land in the folder the run was launched from when the rank runs on
that machine (the embedded cluster), else in the run's own folder (``run.files()``).

``sys.exit(0)`` (or ``None``) ends the rank's function as a success; another exit code is the rank's
failure, with the code and the last lines the script wrote to stderr (an argparse error's usage).
Made in the notebook kernel (:meth:`ScriptProgram.of`, here), run on each rank (:mod:`.script_run`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nbtrain._exceptions import InvalidOptionError, NotSerializableError
from nbtrain._packing.shipping import (
    COMPILED_SUFFIXES,
    MAX_SHIPPED_BYTES,
    SKIPPED_DIRS,
)

LARGEST_SENT_FILE = 1 * 2**20  # a bigger file beside the script (data, checkpoints) stays where it is
NEVER_SENT_SUFFIXES = (".ipynb", ".pyc", ".pt", ".pth", ".ckpt", ".safetensors", ".bin", *COMPILED_SUFFIXES)


@dataclasses.dataclass(frozen=True)
class ScriptProgram:
    """A script and its folder's files, callable on a rank (with the run's ``config``, which it ignores)."""

    script: str                 # the file's path inside the archive
    args: tuple[str, ...]       # its sys.argv[1:]
    archive: bytes              # the script's folder, zipped (see :func:`_folder_archive`)
    digest: str
    shown_path: str             # the path as the user gave it, for messages and the run's header

    @classmethod
    def of(cls, path: str | os.PathLike[str], args: Sequence[str] = ()) -> ScriptProgram:
        """The script at ``path`` with its arguments, checked here, in the notebook, before any rank starts."""
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidOptionError(f"launch_script(path=...) is the path of a Python file, like 'train.py'; "
                                     f"got {path!r}.")
        file = Path(path).expanduser()
        if not file.is_file():
            where = f" (looked in {Path.cwd()})" if not file.is_absolute() else ""
            raise InvalidOptionError(f"launch_script: there is no file {str(path)!r}{where}. Give the script's path, "
                                     "relative to this notebook's folder or absolute.")
        if file.suffix != ".py":
            raise InvalidOptionError(f"launch_script: {str(path)!r} is not a Python script (.py); nbtrain runs a "
                                     "Python file on each rank as torchrun does.")
        if isinstance(args, (str, bytes)) or not all(isinstance(arg, str) for arg in args):
            raise InvalidOptionError(f"launch_script(args=...) is a list of strings, as sys.argv holds them, like "
                                     f"['--epochs', '5']; got {args!r}.")
        try:
            compile(file.read_text(encoding="utf-8"), str(file), "exec")
        except SyntaxError as error:
            raise InvalidOptionError(f"launch_script: {str(path)!r} has a syntax error at line {error.lineno}: "
                                     f"{error.msg}.") from None
        folder = file.resolve().parent
        archive = _folder_archive(folder, file.resolve())
        return cls(script=file.name, args=tuple(args), archive=archive,
                   digest=hashlib.sha256(archive).hexdigest()[:12], shown_path=str(path))

    def default_run_name(self) -> str:
        """A run's name when none is given: the script's file name without ``.py``, with the time."""
        return f"{Path(self.script).stem}-{time.strftime('%Y%m%d-%H%M%S')}"

    def __call__(self, config: dict[str, Any] | None = None) -> Any:
        """On a rank: run the script (:mod:`.script_run`; the run's ``config`` is not the script's)."""
        from nbtrain._packing.script_run import run_script

        return run_script(self.script, self.args, self.archive, self.digest, self.shown_path)


def _folder_archive(folder: Path, script: Path) -> bytes:
    """The script and the files beside it (and in its folder's sub-folders) that a script reads or imports:
    every file up to :data:`LARGEST_SENT_FILE`, not notebooks, checkpoints, weights or compiled extensions,
    not hidden or cache folders nor a virtual environment."""
    buffer, total = io.BytesIO(), 0
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in _files_beside(folder):
            size = path.stat().st_size
            if path != script and (size > LARGEST_SENT_FILE or path.suffix in NEVER_SENT_SUFFIXES):
                continue
            total += size
            if total > MAX_SHIPPED_BYTES:
                raise NotSerializableError(
                    f"The folder of {script.name} ({folder}) holds more than {MAX_SHIPPED_BYTES // 2**20} MB of "
                    "small files, which nbtrain sends with the script. Put the script (and the modules it "
                    "imports) in a folder of its own.")
            archive.write(path, str(path.relative_to(folder)))
    return buffer.getvalue()


def _files_beside(folder: Path) -> Iterator[Path]:
    for where, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")
                         and not (Path(where) / d / "pyvenv.cfg").exists())
        for name in sorted(files):
            if not name.startswith("."):
                yield Path(where) / name
