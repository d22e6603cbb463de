"""``launch()``, ``attach()``, ``runs()`` and the :class:`Run` handle the notebook holds.

A ``Run`` is a *reader* of its supervisor: it keeps cursors into the run's
append-only histories and fetches only what is new, so re-attaching from a
fresh kernel replays the whole history once and then follows it live. All
launch paths — the magic, the launch panel, the lab sidebar — come here.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from nbtrain._client import connection
from nbtrain._exceptions import (
    NbtrainError,
    ResourcesUnavailableError,
    RunExistsError,
    RunFailedError,
    RunNotFoundError,
)
from nbtrain._registry import record_run
from nbtrain._client.serialization import dumps_checked
from nbtrain._cluster.spec import RunSpec
from nbtrain._states import RunState

POLL_TIMEOUT_S = 15.0
SUPERVISOR_RESTART_GRACE_S = 60.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class Run:
    """A training run on the cluster. Get one from :func:`launch` or :func:`attach`.

    Reading ``state``, ``metrics``, ``workers`` or ``logs()`` fetches what is new
    from the run's supervisor (a few milliseconds), so they are always current.
    """

    def __init__(self, name: str, handle: Any, address: str) -> None:
        self.name = name
        self._handle = handle
        self._address = address
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._logs: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._cursors = (0, 0, 0)
        self._summary: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}
        self._recorded_at = 0.0
        self._result: list[Any] | None = None

    # ------------------------------------------------------------------ reading
    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Fetch everything new; returns the new metric rows (also appended to ``metrics``).

        ``wait_s`` > 0 waits up to that long for something new to arrive (a long
        poll: one round trip, answered as soon as a worker's batch lands).

        The round trip runs outside the Run's lock, so reading ``run.metrics`` in a
        cell never queues behind a dashboard's long poll on the same Run. Cursors
        are positions in append-only histories: whichever answer lands second adds
        only what the first did not, so nothing is lost and nothing is seen twice.
        """
        new_rows: list[dict[str, Any]] = []
        while True:
            with self._lock:
                asked = self._cursors
            reply = self._poll(*asked, wait_s)
            wait_s = 0.0
            with self._lock:
                new_rows.extend(self._apply(asked, reply))
            if not reply["has_more"]:
                break
        self._mirror()
        return new_rows

    def _apply(self, asked: tuple[int, int, int], reply: dict[str, Any]) -> list[dict[str, Any]]:
        """Add the part of ``reply``, the answer to a poll from cursors ``asked``, not yet here."""
        have = self._cursors
        rows = reply["rows"][have[0] - asked[0]:]
        self._rows.extend(rows)
        self._logs.extend(reply["logs"][have[1] - asked[1]:])
        self._events.extend(reply["events"][have[2] - asked[2]:])
        self._cursors = (max(have[0], reply["cursor"]), max(have[1], reply["log_cursor"]),
                         max(have[2], reply["event_cursor"]))
        for row in rows:
            self._latest.update((k, v) for k, v in row.items() if k not in ("rank", "step", "attempt", "time"))
        if reply["now"] >= self._summary.get("now", 0.0):  # an answer that was overtaken keeps the newer summary
            self._summary = {k: v for k, v in reply.items()
                             if k not in ("rows", "logs", "events", "cursor", "log_cursor", "event_cursor")}
        return rows

    def _poll(self, cursor: int, log_cursor: int, event_cursor: int, wait_s: float) -> dict[str, Any]:
        """One poll; while the supervisor restarts (Ray brings it back) keep asking, within limits."""
        import ray

        deadline = time.monotonic() + SUPERVISOR_RESTART_GRACE_S
        while True:
            try:
                # A future, not ray.get: over Ray Client the answer then comes back on the
                # session's open data stream instead of a new gRPC call per poll, which saves
                # the Ray Client proxy about a third of its CPU per poll (on a laptop, CPU the
                # ranks need; benchmarks/README.md has the figures).
                reply = self._handle.poll.remote(cursor, log_cursor, event_cursor, wait_s=wait_s).future()
                return reply.result(timeout=POLL_TIMEOUT_S + wait_s)
            except concurrent.futures.TimeoutError:
                msg = (f"Run {self.name!r}'s supervisor did not answer within {POLL_TIMEOUT_S:.0f} s; "
                       f"it may be restarting. Try again shortly.")
                raise NbtrainError(msg) from None
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                if time.monotonic() > deadline or _find_supervisor(self.name) is None:
                    msg = (f"Run {self.name!r}'s supervisor is gone ({type(exc).__name__}). "
                           f"The run was deleted or its cluster restarted.")
                    raise RunNotFoundError(msg) from None
                time.sleep(0.5)

    def _mirror(self) -> None:
        """Keep the sidebar's file for this run current (at most once a second while it runs)."""
        with self._lock:
            now = time.time()
            terminal = RunState(self._summary["state"]).is_terminal
            if now - self._recorded_at < 1.0 and not terminal:
                return
            self._recorded_at = now
            summary, latest = dict(self._summary), dict(self._latest)
        try:
            record_run(summary, self._address, latest)
        except OSError:
            pass
        connection.record_current()  # the sidebar's "CPUs used" stays current

    @property
    def cached_summary(self) -> dict[str, Any]:
        """The run's summary as of the last read, without asking the cluster (for redraw loops)."""
        with self._lock:
            return dict(self._summary)

    def cached_rows(self, start: int = 0) -> list[dict[str, Any]]:
        """Metric rows already fetched, from index ``start`` on. A view that reads by index
        misses nothing, whichever ``refresh()`` (its own or a cell's ``run.metrics``) fetched them."""
        with self._lock:
            return self._rows[start:]

    def cached_log_entries(self, start: int = 0) -> list[dict[str, Any]]:
        """Log chunks (rank, stream, time, text) already fetched, from index ``start`` on."""
        with self._lock:
            return self._logs[start:]

    def cached_events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def _fresh_summary(self) -> dict[str, Any]:
        self.refresh()
        return self._summary

    @property
    def state(self) -> RunState:
        """``pending``, ``starting``, ``running``, ``restarting``, ``succeeded``, ``failed`` or ``stopped``."""
        return RunState(self._fresh_summary()["state"])

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every reported row so far: ``rank``, ``step``, ``attempt``, ``time`` and the values."""
        self.refresh()
        with self._lock:
            return list(self._rows)

    @property
    def workers(self) -> list[dict[str, Any]]:
        """One dict per rank: node, pid, device, state, step, samples/s, memory, heartbeat age, and
        ``malloc_tuned`` (whether the rank keeps freed memory for its next step; see README)."""
        return list(self._fresh_summary()["workers"])

    @property
    def error(self) -> str | None:
        """Every failing rank with its traceback, or ``None``."""
        return self._fresh_summary()["error"]

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._fresh_summary()["config"])

    @property
    def attempt(self) -> int:
        return int(self._fresh_summary()["attempt"])

    @property
    def events(self) -> list[dict[str, Any]]:
        """State changes, failures, restarts, stalls and checkpoints, in order."""
        self.refresh()
        with self._lock:
            return list(self._events)

    def logs(self, rank: int | None = None) -> str:
        """What the workers printed (stdout and stderr), for one rank or all of them."""
        self.refresh()
        with self._lock:
            chunks = [entry for entry in self._logs if rank is None or entry["rank"] == rank]
        if rank is not None:
            return "".join(entry["text"] for entry in chunks)
        return "".join(f"[rank {entry['rank']}] {line}\n" for entry in chunks
                       for line in entry["text"].splitlines() if line.strip())

    @property
    def result(self) -> list[Any] | None:
        """What the training function returned on each rank (a list indexed by rank), once succeeded."""
        import ray

        if self._result is None:
            raw = ray.get(self._handle.result.remote(), timeout=POLL_TIMEOUT_S)
            if raw is not None:
                self._result = [cloudpickle.loads(item) for item in raw]
        return self._result

    def summary(self) -> dict[str, Any]:
        return dict(self._fresh_summary())

    # ------------------------------------------------------------------ control
    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True,
             poll_interval: float = 0.5) -> RunState:
        """Block until the run ends (or ``timeout`` seconds pass) and return its state.

        Raises :class:`RunFailedError` with every failing rank's traceback when the
        run failed (pass ``raise_on_failure=False`` to just get the state), and
        ``TimeoutError`` if ``timeout`` passes first; the run keeps going then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.refresh(wait_s=poll_interval)
            state = RunState(self._summary["state"])
            if state.is_terminal:
                if state == RunState.FAILED and raise_on_failure:
                    raise RunFailedError(f"Run {self.name!r} failed.\n{self._summary.get('error')}")
                return state
            if deadline is not None and time.monotonic() > deadline:
                msg = (f"Run {self.name!r} is still {state.value} after {timeout:g} s; it keeps going. "
                       f"Call run.wait() again, or run.stop().")
                raise TimeoutError(msg)

    def stop(self, timeout: float = 30.0) -> RunState:
        """Stop the run: workers are killed and their resources freed before this returns."""
        import ray

        try:
            ray.get(self._handle.stop.remote(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            msg = f"Run {self.name!r} did not stop within {timeout:g} s; its supervisor may be stuck."
            raise NbtrainError(msg) from None
        return self.state

    def load_checkpoint(self, *, weights_only: bool = True) -> Any | None:
        """The run's latest checkpoint in the notebook (``None`` if none was saved).

        Loaded with ``torch.load(weights_only=True)``: only tensors and plain
        containers. Pass ``weights_only=False`` only for checkpoints you trust.
        """
        import io

        import ray
        import torch

        found = ray.get(self._handle.latest_checkpoint.remote(), timeout=120)
        if found is None:
            return None
        _meta, data, path = found
        source: Any = io.BytesIO(data) if data is not None else path
        return load_trusted(torch, source, weights_only)

    def delete(self) -> None:
        """Forget a finished run on the cluster (its supervisor and stored history)."""
        import ray

        if not self.state.is_terminal:
            msg = f"Run {self.name!r} is still {self.state.value}; stop it before deleting it."
            raise NbtrainError(msg)
        ray.kill(self._handle, no_restart=True)

    def dashboard(self, **options: Any) -> Any:
        """The live dashboard (widgets in a notebook, a text line elsewhere)."""
        from nbtrain._views.dashboard import show_dashboard

        return show_dashboard(self, **options)

    def __repr__(self) -> str:
        summary = self._summary
        state = summary.get("state", "?")
        return f"<nbtrain.Run {self.name!r} {state}, attempt {summary.get('attempt', '?')}, {len(self._rows)} rows>"


# ---------------------------------------------------------------------- launching
def launch(
    train_fn: Callable[..., Any],
    *,
    config: dict[str, Any] | None = None,
    workers: int = 2,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    name: str | None = None,
    max_failures: int = 0,
    wait: bool = False,
    datasets: dict[str, Any] | None = None,
    storage: str | None = None,
    collective_timeout_s: float = 300.0,
    stall_timeout_s: float = 300.0,
    on_stall: str = "warn",
    placement_timeout_s: float = 60.0,
    stop_on_nan: bool = False,
    total_steps: int | None = None,
    total_epochs: int | None = None,
    checkpoint_weights_only: bool = True,
    env: dict[str, str] | None = None,
    sources: dict[str, str] | None = None,
    resume: bool = False,
) -> Run:
    """Start ``train_fn`` on ``workers`` DDP ranks on the connected cluster.

    ``train_fn`` takes the ``config`` dict or nothing. It may be defined in the
    notebook and use notebook classes and variables; they are pickled and sent.
    The run is owned by the cluster: it keeps going if the notebook goes away.

    Example::

        def train(config):
            model = nbtrain.prepare_model(Net())
            for step in range(config["steps"]):
                ...
                nbtrain.report(loss=loss.item())

        run = nbtrain.launch(train, config={"steps": 100}, workers=2)
        run.wait()
    """
    import ray

    from nbtrain._cluster.supervisor import NAMESPACE, RunSupervisor, actor_name

    cluster = connection.current()
    config = dict(config or {})
    takes_config = _check_signature(train_fn)
    _check_numbers(workers, cpus_per_worker, gpus_per_worker, max_failures, on_stall)
    name = name or _default_name()
    if not _NAME_RE.match(name):
        msg = f"Run name {name!r} is not valid: use letters, digits, '-', '_' or '.', starting with a letter or digit."
        raise NbtrainError(msg)
    check_resources(workers, cpus_per_worker, gpus_per_worker)
    existing = _find_supervisor(name)
    if existing is not None and not resume:
        msg = (f"A run named {name!r} already exists on {cluster.address}. Pick another name, "
               f"continue it from its latest checkpoint with resume=True (%%ray_train --resume), "
               f"attach to it with nbtrain.attach({name!r}), or delete it with nbtrain.attach({name!r}).delete().")
        raise RunExistsError(msg)
    if existing is None and resume:
        msg = f"resume=True needs an existing run named {name!r}, and there is none on {cluster.address}."
        raise RunNotFoundError(msg)
    fn_bytes = dumps_checked(train_fn)
    spec = RunSpec(
        name=name, fn_bytes=fn_bytes, fn_takes_config=takes_config, config=config, workers=workers,
        cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker, max_failures=max_failures,
        collective_timeout_s=collective_timeout_s, stall_timeout_s=stall_timeout_s, on_stall=on_stall,
        placement_timeout_s=placement_timeout_s, storage=storage, stop_on_nan=stop_on_nan,
        checkpoint_weights_only=checkpoint_weights_only, total_steps=total_steps,
        total_epochs=total_epochs or _guess_epochs(config), owner=_owner(),
        env=dict(env or {}), sources=dict(sources or {}),
    )
    if existing is not None:
        state = ray.get(existing.resume.remote(cloudpickle.dumps(spec), datasets), timeout=POLL_TIMEOUT_S)
        if state != "resumed":
            msg = f"Run {name!r} is still {state}; only an ended run can be resumed. Attach to it instead."
            raise RunExistsError(msg)
        run = Run(name, existing, cluster.address)
        if wait:
            run.wait()
        return run
    handle = ray.remote(RunSupervisor).options(
        name=actor_name(name), namespace=NAMESPACE, lifetime="detached", max_restarts=-1,
        max_task_retries=0, max_concurrency=64, num_cpus=0,
        resources={"node:__internal_head__": 0.001},
    ).remote(cloudpickle.dumps(spec), datasets)  # datasets as an argument: Ray Client maps their object refs
    run = Run(name, handle, cluster.address)
    if wait:
        run.wait()
    return run


def load_trusted(torch: Any, source: Any, weights_only: bool) -> Any:
    """``torch.load`` that explains the weights-only refusal instead of dumping pickle internals."""
    import pickle

    try:
        return torch.load(source, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        msg = ("The checkpoint holds objects other than tensors and plain containers, so it was not loaded "
               "(weights_only=True protects against code in untrusted pickles). Save state_dicts instead, or, "
               f"if you trust this checkpoint, load it with weights_only=False. Detail: {str(exc).splitlines()[0]}")
        raise NbtrainError(msg) from None


def _check_signature(train_fn: Callable[..., Any]) -> bool:
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


def _check_numbers(workers: Any, cpus: Any, gpus: Any, max_failures: Any, on_stall: str) -> None:
    if not isinstance(workers, int) or workers < 1:
        raise NbtrainError(f"workers must be a whole number of at least 1, got {workers!r}.")
    if not isinstance(cpus, (int, float)) or cpus <= 0:
        raise NbtrainError(f"cpus_per_worker must be a positive number, got {cpus!r}.")
    if not isinstance(gpus, (int, float)) or gpus < 0:
        raise NbtrainError(f"gpus_per_worker must be 0 or more, got {gpus!r}.")
    if not isinstance(max_failures, int) or max_failures < 0:
        raise NbtrainError(f"max_failures must be a whole number of 0 or more, got {max_failures!r}.")
    if on_stall not in ("warn", "fail", "restart"):
        raise NbtrainError(f"on_stall must be 'warn', 'fail' or 'restart', got {on_stall!r}.")


def check_resources(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> None:
    """Refuse at once a request the cluster can never hold, listing what it has."""
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    total_cpu = sum(n["Resources"].get("CPU", 0) for n in nodes)
    total_gpu = sum(n["Resources"].get("GPU", 0) for n in nodes)
    per_node = [(n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in nodes]
    fits_per_node = sum(min(math.floor(c / cpus_per_worker + 1e-9),
                            math.floor(g / gpus_per_worker + 1e-9) if gpus_per_worker else 1 << 30)
                        for c, g in per_node)
    if fits_per_node >= workers:
        return
    picture = "; ".join(f"node {n['NodeManagerAddress']}: {c:g} CPU, {g:g} GPU"
                        for n, (c, g) in zip(nodes, per_node))
    want = f"{workers} workers × ({cpus_per_worker:g} CPU, {gpus_per_worker:g} GPU)"
    need = f"{workers * cpus_per_worker:g} CPU and {workers * gpus_per_worker:g} GPU"
    hint = "fewer workers"
    if gpus_per_worker and total_gpu == 0:
        hint = "--gpus-per-worker 0 (this cluster has no GPUs)"
    elif gpus_per_worker:
        hint = f"at most {int(total_gpu // gpus_per_worker)} workers with {gpus_per_worker:g} GPU each"
    else:
        hint = f"at most {fits_per_node} workers with {cpus_per_worker:g} CPU each, or fewer CPUs per worker"
    msg = (f"The cluster cannot hold {want} = {need}: it has {total_cpu:g} CPU and {total_gpu:g} GPU in all "
           f"({picture}), room for {fits_per_node} such worker(s). Ask for {hint}, or add nodes.")
    raise ResourcesUnavailableError(msg)


def _guess_epochs(config: dict[str, Any]) -> int | None:
    value = config.get("epochs")
    return value if isinstance(value, int) and value > 0 else None


def _default_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + os.urandom(2).hex()


def _owner() -> dict[str, Any]:
    return {"notebook": os.environ.get("JPY_SESSION_NAME"), "host": socket.gethostname(), "pid": os.getpid()}


# ---------------------------------------------------------------------- finding runs
def _find_supervisor(name: str) -> Any | None:
    import ray

    from nbtrain._cluster.supervisor import NAMESPACE, actor_name

    try:
        return ray.get_actor(actor_name(name), namespace=NAMESPACE)
    except ValueError:
        return None


def _run_names() -> list[str]:
    import ray.util

    from nbtrain._cluster.supervisor import ACTOR_PREFIX, NAMESPACE

    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(entry["name"][len(ACTOR_PREFIX):] for entry in named
                  if entry.get("namespace") == NAMESPACE and entry["name"].startswith(ACTOR_PREFIX))


def attach(name: str) -> Run:
    """A :class:`Run` for a run started elsewhere (another kernel, before a restart), with its whole history.

    Example::

        run = nbtrain.attach("cifar")
        run.dashboard()
    """
    cluster = connection.current()
    handle = _find_supervisor(name)
    if handle is None:
        known = ", ".join(_run_names()) or "none"
        msg = f"No run named {name!r} on {cluster.address}. Runs there: {known}. See nbtrain.runs()."
        raise RunNotFoundError(msg)
    run = Run(name, handle, cluster.address)
    run.refresh()
    return run


def runs() -> list[dict[str, Any]]:
    """Every run on the connected cluster: name, state, attempt, step, workers, started, owner."""
    import ray

    cluster = connection.current()
    names = _run_names()
    handles = [_find_supervisor(name) for name in names]
    refs = [(name, h.summary.remote()) for name, h in zip(names, handles) if h is not None]
    found = []
    for name, ref in refs:
        try:
            summary = ray.get(ref, timeout=POLL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a restarting supervisor must not hide the others
            found.append({"name": name, "state": "unknown"})
            continue
        found.append({key: summary[key] for key in ("name", "state", "attempt", "step", "total_steps", "world_size",
                                                    "started", "ended", "owner", "error")})
        record_run(summary, cluster.address, {})
    return found
