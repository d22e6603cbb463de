"""Widget messages served while a notebook cell blocks, so a running cell's controls act at once.

A Jupyter kernel handles one shell message at a time: while a ``%%ray_train`` cell blocks until its run
ends, the front end's widget messages (a click on Pause, an edited lr field) wait behind it, and the
dashboard's controls would act only once the run is over. While such a cell waits,
:func:`widget_messages_served` takes the messages addressed to the kernel's main shell itself: widget
(comm) messages are handled there and then; every other request (the next cell of Run All, a
completion, a kernel-info request) is held and handed back to the kernel, in its order, when the cell
ends, so Run All still runs one cell after another and an error still stops the cells after it.

Where the messages wait is the kernel's own business, so this module is the one place that reads
ipykernel's internals (as ``_ray_compat`` is for Ray's):

- ipykernel 6 queues them on the main thread (``Kernel.do_one_iteration`` takes one); its
  ``execute_request`` handler is swapped for one that holds the request, as ``jupyter-ui-poll`` does;
- ipykernel 7 has no such call: its shell channel thread forwards the main shell's messages over an
  in-process socket that the blocked main thread reads here.

Each message is dispatched by the kernel's own ``dispatch_shell`` on a helper thread (the main thread's
event loop is the one the blocked cell runs in). A kernel with neither shape (another kernel, a newer
ipykernel that moved them) serves nothing, and a wait that blocks there says :data:`UNSERVED` on the
run's dashboards (:func:`~nbtrain._client.run.following.block_until_done`): their controls act only on a
run that does not block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

SERVE_INTERVAL_S = 0.1   # how often a blocked cell looks for widget messages: a click acts within this
COMM_MESSAGES = frozenset({"comm_open", "comm_msg", "comm_close", "comm_info_request"})
UNSERVED = ("This kernel handles the dashboard's controls only after the waiting cell ends: steer this run from "
            "another notebook (nbtrain.attach), or start it without waiting (--bg, launch(wait=False)).")
OFF_VARIABLE = "NBTRAIN_SERVE_WIDGETS"  # "0": a blocked cell serves no widget messages (they wait for its end)
_REPLAYS: set[asyncio.Task[Any]] = set()


def _kernel() -> Any:
    """The ipykernel kernel this code runs in, or None (a terminal, a script, marimo)."""
    if os.environ.get(OFF_VARIABLE, "1") == "0":
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return getattr(get_ipython(), "kernel", None)


def _shape(kernel: Any) -> str | None:
    """Which kernel internals hold the waiting messages: "queue" (ipykernel 6), "socket" (7), or None."""
    if kernel is None or threading.current_thread() is not threading.main_thread():
        return None
    manager = getattr(getattr(kernel, "shell_channel_thread", None), "manager", None)
    if manager is not None and hasattr(getattr(manager, "_shell_channel_to_main", None), "to_socket"):
        return "socket"
    if inspect.iscoroutinefunction(getattr(kernel, "do_one_iteration", None)) and hasattr(kernel, "shell_handlers"):
        return "queue"
    return None


class _HelperLoop:
    """A thread with an event loop of its own: the kernel's coroutines run there while the main thread,
    whose loop is busy with the blocked cell, waits for each."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nbtrain-widget-messages")

    def run(self, coroutine_function: Callable[[], Any]) -> Any:
        return self._pool.submit(asyncio.run, coroutine_function()).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class _Served:
    """What both shapes share: the cell's output parent kept, the helper loop, the held requests."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.helper = _HelperLoop()
        self.parent = kernel.get_parent("shell") if _takes_channel(kernel.get_parent) else kernel.get_parent()
        self.ident = _parent_ident(kernel)

    def keep_parent(self) -> None:
        """Output printed by the cell goes on under the cell: a dispatched message made itself the parent."""
        if _takes_channel(self.kernel.set_parent):
            self.kernel.set_parent(self.ident, self.parent, "shell")
        else:
            self.kernel.set_parent(self.ident, self.parent)

    def dispatch(self, coroutine_function: Callable[[], Any]) -> None:
        """Run one of the kernel's dispatching coroutines on the helper loop; the cell's output stays the cell's."""
        try:
            self.helper.run(coroutine_function)
        finally:
            self.keep_parent()

    def serve(self) -> None:
        raise NotImplementedError

    def hand_back(self) -> None:
        """Give the kernel the requests held while the cell blocked, to run after it in their order."""
        raise NotImplementedError

    def close(self) -> None:
        try:
            self.serve()
        finally:
            self.hand_back()
            self.helper.close()


class _FromQueue(_Served):
    """ipykernel 6: ``do_one_iteration`` dispatches one queued message; ``execute_request`` is held."""

    def __init__(self, kernel: Any) -> None:
        super().__init__(kernel)
        self.held: list[tuple[Any, Any, Any]] = []
        self.original = kernel.shell_handlers["execute_request"]

        async def hold(stream: Any, ident: Any, parent: Any) -> None:
            self.held.append((stream, ident, parent))

        kernel.shell_handlers["execute_request"] = hold

    def serve(self) -> None:
        for _ in range(50):  # a burst of edits is served in one go; the rest at the next call
            queue = self.kernel.msg_queue
            self.kernel.shell_stream.flush()
            if queue.empty():
                return
            self.dispatch(self.kernel.do_one_iteration)

    def hand_back(self) -> None:
        self.kernel.shell_handlers["execute_request"] = self.original
        for stream, ident, parent in self.held:  # queued behind the blocked cell, in their order
            self.kernel.schedule_dispatch(self._replay, stream, ident, parent)

    async def _replay(self, stream: Any, ident: Any, parent: Any) -> None:
        kernel = self.kernel
        kernel.set_parent(ident, parent, "shell")
        kernel._publish_status("busy", "shell")
        try:
            if kernel._aborting:  # the blocked cell failed: the cells after it do not run (Run All stops)
                kernel._send_abort_reply(stream, parent, ident)
            else:
                await kernel.execute_request(stream, ident, parent)
        finally:
            kernel._publish_status_and_flush("idle", "shell", stream)


class _FromSocket(_Served):
    """ipykernel 7: the shell channel thread's messages for the main shell, read from its in-process socket."""

    def __init__(self, kernel: Any) -> None:
        super().__init__(kernel)
        self.socket = kernel.shell_channel_thread.manager._shell_channel_to_main.to_socket
        self.held: list[Any] = []
        self.concurrent = "concurrent" in inspect.signature(kernel.dispatch_shell).parameters

    def _msg_type(self, frames: list[Any]) -> str | None:
        try:
            _idents, rest = self.kernel.session.feed_identities(frames, copy=False)
            header = self.kernel.session.deserialize(rest, content=False, copy=False)["header"]
        except Exception:  # noqa: BLE001 - not a message (e.g. the kernel's "stop aborting" marker): held
            return None
        msg_type = header.get("msg_type")
        return str(msg_type) if msg_type else None

    def serve(self) -> None:
        import zmq

        for _ in range(50):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if self._msg_type(frames) not in COMM_MESSAGES:
                self.held.append(frames)
                continue
            self.dispatch(functools.partial(self.kernel.dispatch_shell, frames, subshell_id=None,
                                            **({"concurrent": True} if self.concurrent else {})))

    def hand_back(self) -> None:
        loop = asyncio.get_event_loop()
        # each waits for the shell's lock, which the blocked cell holds until it ends: they run after it,
        # in their order, ahead of anything the kernel reads from the socket later
        for frames in self.held:
            replay = loop.create_task(self.kernel.shell_main(None, frames))
            _REPLAYS.add(replay)  # kept until it ran: the loop holds its tasks weakly
            replay.add_done_callback(_REPLAYS.discard)


@contextlib.contextmanager
def widget_messages_served() -> Iterator[Callable[[], None] | None]:
    """For the length of a blocking wait: a function to call every ``SERVE_INTERVAL_S`` that handles the
    widget messages waiting for this kernel; None outside a Jupyter kernel's main thread (nothing to serve)."""
    kernel = _kernel()
    shape = _shape(kernel)
    if shape is None:
        yield None
        return
    served: _Served = _FromSocket(kernel) if shape == "socket" else _FromQueue(kernel)
    try:
        yield served.serve
    finally:
        served.close()


def _takes_channel(method: Any) -> bool:
    try:
        return "channel" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _parent_ident(kernel: Any) -> Any:
    """The identities the cell's request came with (ipykernel 7.4 keeps them in a context variable)."""
    getter = getattr(kernel, "_get_shell_context_var", None)
    if getter is not None and hasattr(kernel, "_shell_parent_ident"):
        return getter(kernel._shell_parent_ident)
    idents = getattr(kernel, "_parent_ident", None)
    return idents.get("shell") if isinstance(idents, dict) else idents


def join_serving_widgets(thread: threading.Thread) -> None:
    """``thread.join()``, serving this kernel's widget messages meanwhile: a blocking ``%%ray_tune`` cell's Stop
    trial and Stop sweep act while it waits for its dashboard's thread."""
    with widget_messages_served() as serve:
        while thread.is_alive():
            if serve is not None:
                serve()
            thread.join(SERVE_INTERVAL_S if serve is not None else None)
