"""``launch()``, ``attach()`` and ``runs()``: where every face of nbtrain starts or finds a run.

The magic, the launch panel and the lab sidebar all come here. ``launch()``
turns its keyword arguments into one :class:`~nbtrain._options.RunOptions`
(validated there) and starts the run by the one path every run takes
(:mod:`~nbtrain._client.launching.starting`: the spec checked once, then its supervisor);
the returned :class:`~nbtrain._client.run.handle.Run` only reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtrain import _options
from nbtrain._client.connecting import connection
from nbtrain._client.connecting.head_tasks import stored_names, stored_summaries
from nbtrain._client.launching import starting
from nbtrain._client.run.following import block_until_done
from nbtrain._client.run.handle import POLL_TIMEOUT_S, Run
from nbtrain._client.run.stored import find_stored
from nbtrain._cluster.names import find_supervisor, run_names
from nbtrain._exceptions import RunNotFoundError
from nbtrain._options import RunOptions, refuses_unknown_keywords


@refuses_unknown_keywords
def launch(
    train_fn: Callable[..., Any],
    *,
    name: str | None = None,
    config: dict[str, Any] | None = None,
    workers: int | tuple[int, int] = 2,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    max_failures: int = 0,
    wait: bool = False,
    resume: bool = False,
    total_steps: int | None = None,
    total_epochs: int | None = None,
    datasets: dict[str, Any] | None = None,
    storage: str | None = None,
    checkpoint_weights_only: bool = True,
    backend: str | None = None,
    precision: str | None = None,
    placement_strategy: str = "PACK",
    placement_timeout_s: float = 60.0,
    collective_timeout_s: float = 300.0,
    stall_timeout_s: float = 300.0,
    on_stall: str = "warn",
    stop_on_nan: bool = False,
    guard: dict[str, Any] | None = None,
    scale_lr: str | None = None,
    resize_interval_s: float = 10.0,
    gns: bool = False,
    adaptive_batch: tuple[int, int] | None = None,
    debug_capture_mb: float = 4.0,
    step_timing: bool = True,
    straggler_window_s: float = 10.0,
    flush_interval_s: float = 0.1,
    feed_relay: str = "auto",
    warm: bool = True,
    warm_idle_s: float = 600.0,
    env: dict[str, str] | None = None,
    runtime_env: dict[str, Any] | None = None,
    loggers: tuple[str, ...] | None = None,
    logger_dir: str | None = None,
) -> Run:
    """Start ``train_fn`` on ``workers`` DDP ranks on the connected cluster.

    ``train_fn`` takes the ``config`` dict or nothing. It may be defined in the
    notebook and use notebook classes and variables; they are pickled and sent.
    The run is owned by the cluster: it keeps going if the notebook goes away.
    With ``wait=True`` the call blocks until the run ends; Ctrl-C (the kernel's
    interrupt) then stops the run and says so.

    Args:
        train_fn: the training function, run on every rank; it takes ``config`` or nothing.
            Every other keyword is a run option, listed below.

    Returns:
        The :class:`Run`, started (ended, with ``wait=True``).

    Raises:
        InvalidOptionError: an option has a wrong type or value (nothing was started).
        NotConnectedError: no ``connect()`` first.
        NotSerializableError: something ``train_fn`` uses cannot be sent to the ranks.
        ResourcesUnavailableError: the cluster cannot hold the workers at all.
        RunExistsError: ``name`` is a live run's. An ended run's name is not refused: the new run is
            ``NAME-2`` (``NAME-3``…), said on stderr, and ``resume=True`` continues the ended run instead.
        RunNotFoundError: ``resume=True`` names no existing run.
        StorageError: the cluster cannot write ``storage=``.
        RunFailedError: with ``wait=True``, the run failed.

    Example::

        def train(config):
            model = nbtrain.prepare_model(Net())
            for step in range(config["steps"]):
                ...
                nbtrain.report(loss=loss.item())

        run = nbtrain.launch(train, config={"steps": 100}, workers=2)
        run.wait()
    """
    arguments = {key: value for key, value in locals().items() if key != "train_fn"}
    return start(train_fn, RunOptions(**arguments))


launch.__doc__ = (launch.__doc__ or "") + _options.describe()


def start(train_fn: Callable[..., Any], options: RunOptions) -> Run:
    """``launch()`` once its options are one validated value (the magic and the panel call this too)."""
    checked = starting.checked_spec(train_fn, options)
    if checked.spec.options.resume:
        handle, spec = starting.resume(checked), checked.spec
    else:
        handle, spec = starting.start(checked)
    run = Run(spec.name, handle, checked.address)
    run.reader.times_first_row = True  # this reader follows the run from its launch: its first row is a phase
    if spec.options.wait:
        block_until_done(run, launched=True)
        run.raise_if_failed()
    return run


def attach(name: str) -> Run:
    """A :class:`Run` for a run started elsewhere (another kernel, before a restart), with its whole history.

    Args:
        name: the run's name, as ``runs()`` lists it.

    Returns:
        The :class:`Run`, live or ended.

    Raises:
        RunNotFoundError: the connected cluster has no run of that name (the message lists those it has).
        NotConnectedError: no ``connect()`` first.

    Example::

        run = nbtrain.attach("cifar")
        run.dashboard()
    """
    cluster = connection.current()
    handle = find_supervisor(name) or find_stored(name)
    if handle is None:
        known = ", ".join(sorted({*run_names(), *stored_names()})) or "none"
        msg = f"No run named {name!r} on {cluster.address}. Runs there: {known}. See nbtrain.runs()."
        raise RunNotFoundError(msg)
    run = Run(name, handle, cluster.address)
    run.refresh()
    return run


def runs() -> list[dict[str, Any]]:
    """Every run on the connected cluster: name, state, attempt, step, workers, started, owner.

    Returns:
        One dict per run (``name``, ``state``, ``attempt``, ``step``, ``total_steps``, ``world_size``,
        ``started``, ``ended``, ``owner``, ``error``), live and ended runs alike.

    Raises:
        NotConnectedError: no ``connect()`` first.

    Example::

        [r["name"] for r in nbtrain.runs() if r["state"] == "running"]
    """
    return [{key: summary.get(key) for key in ("name", "state", "attempt", "step", "total_steps", "world_size",
                                               "started", "ended", "owner", "error")}
            for summary in run_summaries()]


def run_summaries() -> list[dict[str, Any]]:
    """Each run's full summary: from its supervisor while it goes on, from its files once ended
    (``{"name", "state": "unknown"}`` for one that does not answer)."""
    import ray

    connection.current()
    handles = [(name, handle) for name in run_names() if (handle := find_supervisor(name)) is not None]
    refs = [(name, handle.summary.remote()) for name, handle in handles]
    found, answered = [], []
    for name, ref in refs:
        try:
            found.append(ray.get(ref, timeout=POLL_TIMEOUT_S))
        except ray.exceptions.RayActorError:
            continue  # it exited just now, as its run ended: its files answer below
        except Exception:  # noqa: BLE001 - a restarting supervisor must not hide the others
            found.append({"name": name, "state": "unknown"})
        answered.append(name)
    ended = stored_summaries(exclude=answered)
    return sorted(found + ended, key=lambda summary: summary.get("started") or 0.0)
