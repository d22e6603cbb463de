"""Small helpers shared by the cluster tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.1, message: str = "condition",
             describe: Callable[[], object] | None = None) -> Any:
    """Call ``predicate`` until it returns something truthy (and return that), at most ``timeout`` s.

    On timeout, fail naming ``message``, and what ``describe()`` says the state is then.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    seen = f" (now: {describe()!r})" if describe is not None else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {message}{seen}")


def waiting_for_an_answer(thread: threading.Thread, call: str) -> bool:
    """Whether ``thread`` is inside ``call`` (a function name), blocked waiting for the cluster's answer.

    That is: asleep in a ``wait`` with none of Ray's own code on its stack, so the
    request has been handed to Ray in full (Ray Client has given it an id) and
    only the answer is awaited.
    """
    import ray

    ray_code = os.path.dirname(ray.__file__) + os.sep
    frame = sys._current_frames().get(thread.ident)
    stack = []
    while frame is not None:
        stack.append(frame.f_code)
        frame = frame.f_back
    return (bool(stack) and stack[0].co_name == "wait" and any(code.co_name == call for code in stack)
            and not any(code.co_filename.startswith(ray_code) for code in stack))


def run_actor_names(run_name: str, run: Any = None) -> list[str]:
    """A run's workers still alive: named ones it started, ones lent to it by a warm pool, and (given
    the ``run``) any process of its worker table still running, but for one idle in a warm pool (its
    run returned there: the process waits for the next run, and is no longer this one's)."""
    import ray.util

    from nbtrain._client.warm import warm_pools

    named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"nbtrain-worker:{run_name}:")]
    pools = [worker for pool in warm_pools().values() for worker in pool]
    lent = [f"warm pid {w['pid']}" for w in pools if w["run"] == run_name]
    idle = {w["pid"] for w in pools if w["run"] is None}
    running = [f"pid {w['pid']}" for w in (run.workers if run is not None else [])
               if pid_alive(w["pid"]) and w["pid"] not in idle]
    return named + lent + running


def pid_alive(pid: int) -> bool:
    """Whether a process of this machine is running (an exited one not yet reaped is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ipython_shell():
    """The test IPython shell (IPython's test app makes one per process; later calls return None)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()
    if "nbtrain" not in shell.extension_manager.loaded:
        shell.run_line_magic("load_ext", "nbtrain")
    return shell


def venv_with_these_packages(root: Path, with_pip: bool = True) -> Path:
    """A new venv at ``root`` that sees the packages of the interpreter running the tests (a venv's or
    the base one's, whichever that is), after its own: a ``.pth`` adds each of this interpreter's
    site directories, their own ``.pth`` files included. ``--system-site-packages`` would lend the
    *base* interpreter's packages instead, which inside a venv are not the ones the tests run with."""
    subprocess.run([sys.executable, "-m", "venv", str(root), *([] if with_pip else ["--without-pip"])], check=True)
    (site_packages,) = root.glob("lib/python*/site-packages")
    borrowed = [entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))
                and Path(entry).is_dir()]
    (site_packages / "_borrowed_from_the_test_interpreter.pth").write_text(
        "".join(f"import site; site.addsitedir({entry!r})\n" for entry in borrowed))
    return root
