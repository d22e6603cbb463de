"""Small helpers shared by the cluster tests."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, interval: float = 0.1, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message}")


def run_actor_names(run_name: str) -> list[str]:
    """Named actors of a run still alive on the cluster (workers are named per run)."""
    import ray.util

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"nbtrain-worker:{run_name}:")]


def ipython_shell():
    """The test IPython shell (IPython's test app makes one per process; later calls return None)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()
    if "nbtrain" not in shell.extension_manager.loaded:
        shell.run_line_magic("load_ext", "nbtrain")
    return shell
