"""The one way nbtrain blocks until a run ends: ``launch(wait=True)``, the magic, the panel, ``Run.wait``.

The kernel's interrupt (Ctrl-C, the ■ button) raises ``KeyboardInterrupt`` in
the blocked call. What it means depends on who started the run: a call that
*launched* the run stops it (the user asked for a blocking run and then asked
it to end); a call that only *follows* a run (``run.wait()``, an attached run,
someone else's) stops waiting and leaves the run going. Either way the user is
told which, and the interrupt goes on up so Run All stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from nbtrain._client.kernel.shell import in_notebook
from nbtrain._client.kernel.widget_messages import SERVE_INTERVAL_S, UNSERVED, widget_messages_served
from nbtrain._states import RunState

LONG_POLL_S = 1.0  # how long one poll waits for news: here, and in a view's thread (nbtrain._views.dashboard.follower)
POLL_WHILE_SERVING_S = 0.5  # a wait with no view of its own polls this often, serving widgets between two polls
VIEWS_DRAW_END_S = 30.0  # a run's end waits this long at most for its dashboards to draw it (the rows' last pages)


def block_until_done(run: Any, *, launched: bool, timeout: float | None = None,
                     view_thread: threading.Thread | None = None) -> RunState:
    """Wait for ``run`` to end and return its state.

    ``view_thread`` is a dashboard's follower thread: the view then does the
    polling (and redraws) and this call only waits for it, so widget updates
    keep reaching the browser while the cell runs. In a Jupyter kernel the
    wait serves the front end's widget messages every ``SERVE_INTERVAL_S``
    (:mod:`nbtrain._client.kernel.widget_messages`): the dashboard's controls act while
    the cell runs. ``TimeoutError`` if ``timeout`` passes first; the run
    keeps going then.
    """
    with widget_messages_served() as serve_widgets:
        if serve_widgets is None and in_notebook():  # its dashboards' controls must not look as if they acted
            run.reader.note_on_views(UNSERVED, colour="#ff7f0e")
        return _wait(run, launched, timeout, view_thread, serve_widgets)


def _wait(run: Any, launched: bool, timeout: float | None, view_thread: threading.Thread | None,
          serve_widgets: Callable[[], None] | None) -> RunState:
    deadline = None if timeout is None else time.monotonic() + timeout
    poll_s = LONG_POLL_S if serve_widgets is None else POLL_WHILE_SERVING_S  # widgets served between two polls
    try:
        while True:
            if serve_widgets is not None:
                serve_widgets()
            if view_thread is not None and view_thread.is_alive():
                # the view ends its thread once it has drawn the end: returning before that (the state is
                # terminal a moment before the last picture is drawn) let the summary land after the cell
                view_thread.join(SERVE_INTERVAL_S if serve_widgets is not None else 0.2)
            else:  # no view, or it gave up (lost contact): poll here
                left = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
                run.refresh(wait_s=left)
            state = RunState(run.reader.summary.get("state", RunState.PENDING))
            if state.is_terminal and (view_thread is None or not view_thread.is_alive()):
                run.reader.await_views(VIEWS_DRAW_END_S)
                return state
            if deadline is not None and time.monotonic() > deadline:
                msg = (f"Run {run.name!r} is still {state.value} after {timeout:g} s; it keeps going. "
                       f"Call run.wait() again, or run.stop().")
                raise TimeoutError(msg)
    except KeyboardInterrupt:
        if launched:
            state = run.stop()
            if view_thread is not None:
                view_thread.join(10)
            print(f"Interrupted: run {run.name!r} was stopped ({state.value}); "
                  f"its workers are gone and their resources freed.", flush=True)
        else:
            print(f"Stopped waiting; run {run.name!r} keeps going. Stop it with run.stop() "
                  f"or %ray_stop {run.name}.", flush=True)
        raise
