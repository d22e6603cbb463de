"""``launch_script()``: a user's torchrun script, unchanged, as a run (the line magic comes here too).

The script becomes a :class:`~nbtrain._packing.script.ScriptProgram` — its file and its folder's files,
checked here before anything starts — and takes the one path every run takes
(:func:`nbtrain._client.entry.launch.start`), with every option ``launch()`` has but ``config``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from nbtrain._client.entry.launch import start
from nbtrain._client.run.handle import Run
from nbtrain._exceptions import InvalidOptionError
from nbtrain._options import RunOptions, check_keywords
from nbtrain._packing.script import ScriptProgram


def launch_script(path: str | os.PathLike[str], args: Sequence[str] = (), **options: Any) -> Run:
    """Run the Python script at ``path`` on every rank, as ``torchrun`` runs it.

    Each rank runs the file as ``__main__`` with ``sys.argv = [script, *args]`` and torchrun's
    environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...); the script's own
    ``init_process_group`` gets the run's process group. The files beside the script travel with it
    and its folder comes first on ``sys.path``. Paths it writes relative to its working directory land
    in the folder the run is launched from when the ranks run on this machine (the embedded cluster),
    else in the run's own folder (``run.files()``). ``sys.exit(0)`` is a success; another exit code is
    the rank's failure, with the script's last lines on stderr.

    Args:
        path: the script, relative to the current folder or absolute.
        args: its command-line arguments, as strings (``["--epochs", "5"]``).
        **options: any option of :func:`launch` but ``config`` (``workers=``, ``max_failures=``...);
            the default ``name`` is the script's, with the time.

    Returns:
        The :class:`Run`, started (ended, with ``wait=True``).

    Raises:
        InvalidOptionError: no such file, not a ``.py`` file, a syntax error, ``args`` not a list of
            strings, or an unknown or bad option (nothing was started).

    Example::

        run = nbtrain.launch_script("train.py", args=["--epochs", "5"], workers=2)
    """
    if "config" in options:
        raise InvalidOptionError("launch_script() has no config: a script reads its arguments; give them as "
                                 "args=['--lr', '0.01'].")
    known = [field.name for field in dataclasses.fields(RunOptions) if field.name != "config"]
    check_keywords(options, known, "launch_script()", "nbtrain.launch")
    program = ScriptProgram.of(path, args)
    name = options.pop("name", None) or program.default_run_name()
    return start(program, RunOptions(name=name, **options))
