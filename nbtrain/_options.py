"""Every run option, declared once: its type, default, validation and help text.

Each face of a launch is derived from :class:`RunOptions` or checked against it:
``launch()`` keeps named keyword arguments (for help and completion) and
``tests/test_options.py`` fails when one differs from a field here in name or
default; ``launch()``'s parameter list in its docstring, the ``%%ray_train``
flags and ``--help``, and the ``LaunchPanel``'s resource fields are generated
from the fields below; the supervisor reads the same object inside the
:class:`~nbtrain._cluster.spec.RunSpec`.

To add an option: add a field with :func:`option` (help text, flags, and the
check in ``__post_init__``), add the keyword to ``launch()``, and read it where
it takes effect. Nothing else needs writing.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import os
import re
import reprlib
import sys
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from nbtrain._cluster.storage.storage_uri import REMOTE_SCHEMES, normalise
from nbtrain._exceptions import InvalidOptionError
from nbtrain._guards import checked_guard
from nbtrain._packing.runtime_env import check_runtime_env

NAME_MAX_LENGTH = 100  # a run's or sweep's name
NAME_PATTERN = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX_LENGTH - 1}}}$")
ON_STALL_CHOICES = ("warn", "fail", "restart")
BACKEND_CHOICES = ("gloo", "nccl")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# how long an elastic attempt above its min waits to be placed before it starts with min (see supervisor.attempt's
# NotPlaced): its size was read from the room free a moment before, placed in well under a second if still there
ELASTIC_PLACEMENT_GRACE_S = 5.0
FEED_RELAY_CHOICES = ("auto", "always", "never")
LOGGER_CHOICES = ("tensorboard", "mlflow")
SCALE_LR_CHOICES = ("linear", "sqrt")
PRECISION_CHOICES = ("bf16-mixed", "16-mixed")  # torch.autocast to bfloat16 / float16 (with a GradScaler)
P = ParamSpec("P")
R = TypeVar("R")
TUNING_NOTE = ("rarely needed: the defaults are what benchmarks/ measured best; they stay settable for clusters "
               "unlike the ones measured")


@dataclasses.dataclass(frozen=True)
class OptionInfo:
    """How one option appears on the faces that set it.

    ``kind`` says how the magic reads it: ``value`` (one token, parsed by
    ``parse``), ``flag`` (a boolean ``--x/--no-x``), ``literals`` (``key=value``
    pairs, values read as Python literals), ``strings`` (``key=value`` pairs kept
    as text), ``variables`` (``key=name`` pairs naming notebook variables) or
    ``json`` (one token: a JSON object, or the name of a notebook variable holding a dict).
    """

    help: str
    flags: tuple[str, ...]
    kind: str = "value"
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    label: str | None = None          # the LaunchPanel's field name; None: not on the panel
    off_flag: str | None = None       # a flag's "off" spelling; default --no-<flag>
    magic_default: Any = None           # only where the magic's nature differs (it blocks)
    tuning: bool = False              # a knob users should not need: listed apart, last (see TUNING_NOTE)


def option(default: Any, help: str, *flags: str, kind: str = "value", parse: Callable[[str], Any] | None = None,
           choices: tuple[str, ...] | None = None, metavar: str | None = None, label: str | None = None,
           off_flag: str | None = None, magic_default: Any = None, tuning: bool = False) -> Any:
    info = OptionInfo(help=help, flags=flags, kind=kind, parse=parse, choices=choices, metavar=metavar,
                      label=label, off_flag=off_flag, magic_default=magic_default, tuning=tuning)
    return dataclasses.field(default=default, metadata={"nbtrain": info})


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a run is asked to be: resources, failure handling, storage, and the call's own behaviour."""

    name: str | None = option(None, "run name (an ended run's name gives NAME-2, NAME-3...); default run-<time>",
                              "--name", "-n", metavar="NAME", label="run name")
    config: dict[str, Any] | None = option(
        None, "the `config` dict given to the training function, e.g. --config lr=0.01 epochs=5",
        "--config", "-c", kind="literals", metavar="KEY=VALUE")
    workers: int | tuple[int, int] = option(
        2, "number of DDP workers (ranks); a range MIN:MAX (launch: a tuple) makes the run elastic: it starts "
        "with what fits, grows toward MAX at a checkpoint when resources free up, shrinks on a lost node",
        "--workers", "-w", parse=lambda text: _parse_workers(text), label="workers", metavar="N|MIN:MAX")
    cpus_per_worker: float = option(1.0, "CPUs reserved per worker", "--cpus-per-worker", parse=float,
                                    label="CPUs per worker")
    gpus_per_worker: float = option(0.0, "GPUs per worker (the nccl backend when > 0)", "--gpus-per-worker",
                                    parse=float, label="GPUs per worker")
    max_failures: int = option(0, "restarts from the latest checkpoint allowed after a worker fails",
                               "--max-failures", parse=int, label="max failures")
    wait: bool = option(False, "block until the run ends (the magic blocks unless --bg; Ctrl-C stops the run)",
                        "--wait", kind="flag", off_flag="--bg", magic_default=True)
    resume: bool = option(False, "continue the ended run of this name from its latest checkpoint",
                          "--resume", kind="flag")
    total_steps: int | None = option(None, "expected steps, for the progress bar and ETA", "--total-steps",
                                     parse=int)
    total_epochs: int | None = option(None, "expected epochs, for the progress bar (default: config['epochs'])",
                                      "--total-epochs", parse=int)
    datasets: dict[str, Any] | None = option(
        None, "Ray Datasets split across the ranks (get_dataset_shard(name)); the magic names notebook "
        "variables: --datasets train=train_ds", "--datasets", kind="variables", metavar="NAME=VARIABLE")
    storage: str | None = option(
        None, "where checkpoints go on multi-node clusters: a shared directory (the run's history goes there too) or "
        "a pyarrow.fs URI (s3://, gs://, hdfs://, abfs://, file://; every node and the notebook need its credentials)",
        "--storage", metavar="PATH|URI")
    checkpoint_weights_only: bool = option(
        True, "load checkpoints with torch.load(weights_only=True); turn off only for checkpoints you trust",
        "--checkpoint-weights-only", kind="flag")
    backend: str | None = option(None, "torch.distributed backend; default nccl with GPUs, else gloo",
                                 "--backend", choices=BACKEND_CHOICES)
    precision: str | None = option(None, "mixed precision of models from prepare_model (their forward runs under "
                                   "torch.autocast); 16-mixed also scales the loss (nbtrain.backward)",
                                   "--precision", choices=PRECISION_CHOICES)
    placement_strategy: str = option("PACK", "how Ray places the workers' bundles on nodes",
                                     "--placement-strategy", choices=PLACEMENT_STRATEGIES)
    placement_timeout_s: float = option(60.0, "seconds to wait for the cluster to place every worker (an elastic "
                                        f"run waits at most {ELASTIC_PLACEMENT_GRACE_S:g} s for more than min, then "
                                        "starts with min)",
                                        "--placement-timeout", parse=float, metavar="SECONDS")
    collective_timeout_s: float = option(300.0, "seconds before a stuck collective (all-reduce) fails",
                                         "--collective-timeout", parse=float, metavar="SECONDS")
    stall_timeout_s: float = option(300.0, "seconds without progress before a rank counts as stalled",
                                    "--stall-timeout", parse=float, metavar="SECONDS")
    on_stall: str = option("warn", "what a stall does", "--on-stall", choices=ON_STALL_CHOICES)
    stop_on_nan: bool = option(False, "fail the run when a reported metric is NaN", "--stop-on-nan", kind="flag")
    guard: dict[str, Any] | None = option(None, "guard against divergence on the ranks, as run.guard: e.g. --guard "
                                          "nan=rewind spike=3 lr_factor=0.5", "--guard", kind="literals", metavar="K=V")
    flush_interval_s: float = option(0.1, "seconds between a rank's batched sends of metrics and logs",
                                     "--flush-interval", parse=float, metavar="SECONDS", tuning=True)
    scale_lr: str | None = option(
        None, "elastic runs, at a world size w other than min: by default each rank's prepare_loader batch is "
        "scaled by min/w, keeping the global batch of min ranks; linear or sqrt keeps each rank's batch and "
        "scales prepare_optimizer's learning rate by w/min (or its square root)", "--scale-lr",
        choices=SCALE_LR_CHOICES)
    resize_interval_s: float = option(10.0, "elastic runs: seconds between checks for room to grow",
                                      "--resize-interval", parse=float, metavar="SECONDS", tuning=True)
    gns: bool = option(False, "estimate the gradient noise scale from DDP's gradients (2+ workers, batches from "
                       "prepare_loader) and add it to every reported row as gns", "--gns", kind="flag")
    adaptive_batch: tuple[int, int] | None = option(
        None, "pick each rank's prepare_loader batch size between MIN and MAX at every epoch for the most progress "
        "per second (from gns and measured step times; Pollux's rule), scaling prepare_optimizer's learning rate "
        "(AdaScale's gain)", "--adaptive-batch", parse=lambda text: _parse_range(text, "batch sizes"),
        metavar="MIN:MAX")
    debug_capture_mb: float = option(
        4.0, "MB a failing rank may keep of its frames' local values for %ray_debug / run.debug() (values past it "
        "are kept as their repr, tensors always as shape, dtype, device and statistics); 0 keeps no post-mortem",
        "--debug-capture-mb", parse=float, metavar="MB")
    step_timing: bool = option(
        True, "time each rank's steps into data wait, compute and gradient communication (the worker table, "
        "the step-time plot, straggler events)", "--step-timing", kind="flag")
    straggler_window_s: float = option(
        10.0, "seconds a rank's own step time (without waiting for the others) must stay above 1.25x the ranks' "
        "median before it is flagged as a straggler, and below it before the flag is cleared",
        "--straggler-window", parse=float, metavar="SECONDS", tuning=True)
    feed_relay: str = option("auto", "gather each node's metric pushes into one call to the supervisor per flush; "
                             "auto: on nodes holding 2+ ranks of runs of 16+ ranks", "--feed-relay",
                             choices=FEED_RELAY_CHOICES, tuning=True)
    warm: bool = option(True, "keep the workers ready, idle, for this notebook session's next run with the same CPUs, "
                        "GPUs and env per worker (they reserve no CPU or GPU while idle)", "--warm", kind="flag")
    warm_idle_s: float = option(600.0, "seconds idle warm workers wait for the next run before they exit",
                                "--warm-idle", parse=float, metavar="SECONDS", tuning=True)
    env: dict[str, str] | None = option(None, "environment variables for the workers, e.g. --env OMP_NUM_THREADS=1",
                                        "--env", kind="strings", metavar="KEY=VALUE")
    runtime_env: dict[str, Any] | None = option(
        None, "Ray's runtime environment for the ranks, its own dict (pip, uv, env_vars, working_dir, py_modules, "
        "…), checked before launch; the magic takes JSON or a notebook variable: --runtime-env '{\"pip\": [\"timm\"]}'",
        "--runtime-env", kind="json", metavar="JSON|VARIABLE")
    loggers: tuple[str, ...] | None = option(None, "also write every rank's metrics with these libraries' own writers, "
                                             "from the cluster: tensorboard, mlflow (comma-separated)", "--logger",
                                             parse=lambda text: tuple(text.split(",")), metavar="NAMES")
    logger_dir: str | None = option(None, "where TensorBoard events and the MLflow file store go (default: the run's "
                                    "directory on the head node; MLflow uses MLFLOW_TRACKING_URI when set)",
                                    "--logger-dir", metavar="DIR")

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_mapping("config", self.config, values_are_text=False)
        _check_mapping("env", self.env, values_are_text=True)
        _check_mapping("datasets", self.datasets, values_are_text=False)
        _check_env(self.env)
        check_runtime_env(self.runtime_env, self.env)
        _check_datasets(self.datasets)
        for name in ("workers", "adaptive_batch"):
            given: Any = getattr(self, name)
            if isinstance(given, list):  # workers=[2, 4] from a JSON-minded caller
                object.__setattr__(self, name, tuple(given))
        _check_workers(self.workers)
        _check_adaptive_batch(self.adaptive_batch, self.min_workers)
        _check_number("cpus_per_worker", self.cpus_per_worker, "a positive number", lambda v: v > 0)
        _check_number("gpus_per_worker", self.gpus_per_worker, "0 or more", lambda v: v >= 0)
        _check_whole("max_failures", self.max_failures, minimum=0)
        for name in ("total_steps", "total_epochs"):
            if getattr(self, name) is not None:
                _check_whole(name, getattr(self, name), minimum=1)
        for name in ("placement_timeout_s", "collective_timeout_s", "stall_timeout_s", "warm_idle_s",
                     "resize_interval_s", "straggler_window_s"):
            _check_number(name, getattr(self, name), "a positive number of seconds", lambda v: v > 0)
        _check_number("flush_interval_s", self.flush_interval_s, "between 0.01 and 10 seconds",
                      lambda v: 0.01 <= v <= 10)
        _check_number("debug_capture_mb", self.debug_capture_mb, "between 0 and 1024 MB (0 keeps no post-mortem)",
                      lambda v: 0 <= v <= 1024)
        _check_choice("on_stall", self.on_stall, ON_STALL_CHOICES)
        _check_choice("placement_strategy", self.placement_strategy, PLACEMENT_STRATEGIES)
        _check_choice("feed_relay", self.feed_relay, FEED_RELAY_CHOICES)
        if self.precision is not None:
            _check_choice("precision", self.precision, PRECISION_CHOICES)
        if self.scale_lr is not None:
            _check_choice("scale_lr", self.scale_lr, SCALE_LR_CHOICES)
        _check_loggers(self.loggers)
        object.__setattr__(self, "guard", None if self.guard is None else checked_guard(self.guard, "guard (--guard)"))
        if self.logger_dir is not None and (not isinstance(self.logger_dir, str) or not os.path.isabs(self.logger_dir)):
            raise InvalidOptionError(_problem("logger_dir", "an absolute directory path on the head node",
                                              self.logger_dir))
        if self.backend is not None:
            _check_choice("backend", self.backend, BACKEND_CHOICES)
            if self.backend == "nccl" and not self.gpus_per_worker:
                raise InvalidOptionError(_problem("backend", "'gloo' on a run without GPUs (nccl needs one GPU "
                                                             "per worker: set gpus_per_worker)", self.backend))
        if self.storage is not None:
            _check_storage(self.storage)
            object.__setattr__(self, "storage", normalise(self.storage))  # file:///x is the path /x
        for name in ("wait", "resume", "stop_on_nan", "checkpoint_weights_only", "warm", "gns",
                     "step_timing"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidOptionError(_problem(name, "True or False", getattr(self, name)))

    @property
    def min_workers(self) -> int:
        return self.workers[0] if isinstance(self.workers, tuple) else self.workers

    @property
    def max_workers(self) -> int:
        return self.workers[1] if isinstance(self.workers, tuple) else self.workers

    @property
    def elastic(self) -> bool:
        return self.min_workers != self.max_workers

    @property
    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        return "nccl" if self.gpus_per_worker > 0 else "gloo"


def fields() -> list[dataclasses.Field[Any]]:
    """The options in declaration order, tuning knobs last (the order of ``--help`` and of ``launch()``'s
    docstring)."""
    declared = list(dataclasses.fields(RunOptions))
    return [f for f in declared if not info(f).tuning] + [f for f in declared if info(f).tuning]


def info(field: dataclasses.Field[Any]) -> OptionInfo:
    return field.metadata["nbtrain"]  # type: ignore[no-any-return]


def flag_of(name: str) -> str:
    """The ``%%ray_train`` flag of option ``name``, e.g. ``--stall-timeout`` for ``stall_timeout_s``."""
    return info(next(f for f in fields() if f.name == name)).flags[0]


def default_of(name: str) -> Any:
    return next(f for f in fields() if f.name == name).default


def magic_default_of(field: dataclasses.Field[Any]) -> Any:
    """The flag's default in ``%%ray_train``: the declared default, except where the magic differs by nature."""
    meta = info(field)
    return field.default if meta.magic_default is None else meta.magic_default


def panel_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in fields() if info(f).label is not None]


def describe() -> str:
    """The ``Options`` section of ``launch()``'s docstring, from the declarations."""
    lines = ["", "    Options (each also a ``%%ray_train`` flag)::", ""]
    for field in fields():
        meta = info(field)
        if meta.tuning and not info(fields()[fields().index(field) - 1]).tuning:
            lines.extend(["", f"        Tuning ({TUNING_NOTE}):", ""])
        lines.append(f"        {field.name}={field.default!r}  ({meta.flags[0]})")
        lines.append(f"            {meta.help}")
    return "\n".join(lines) + "\n"


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxdict = _SHORT.maxlist = 6


def check_keywords(given: Iterable[str], known: Iterable[str], call: str, documented: str) -> None:
    """Refuse keywords ``call`` does not take, each with the known one closest to it (a typo, mostly);
    ``documented``: the function whose help lists them all."""
    known = list(known)
    unknown = [name for name in given if name not in known]
    if unknown:
        said = "; ".join(f"{name!r}" + (f" (did you mean {close[0]}?)"
                                        if (close := difflib.get_close_matches(name, known, n=1)) else "")
                         for name in unknown)
        raise InvalidOptionError(f"{call} has no option {said}. help({documented}) lists every option.")


def refuses_unknown_keywords(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` (``launch``, ``tune``) says which keyword it does not take and which it has instead, where
    Python's own ``TypeError`` only names the unknown one."""
    known = [name for name, parameter in inspect.signature(fn).parameters.items()
             if parameter.kind is inspect.Parameter.KEYWORD_ONLY or parameter.kind is parameter.POSITIONAL_OR_KEYWORD]

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        check_keywords(kwargs, known, f"{fn.__name__}()", f"nbtrain.{fn.__name__}")
        return fn(*args, **kwargs)

    return checked


def _problem(name: str, what: str, got: Any) -> str:
    """``name (--flag) must be <what>, got <value>``; the value's repr is kept short (a config can be huge)."""
    shown = _SHORT.repr(got)
    return f"{name} ({flag_of(name)}) must be {what}, got {shown if len(shown) <= 200 else shown[:199] + '…'}."


def _check_storage(value: Any) -> None:
    """A path relative to what? The supervisor and every rank run in directories of Ray's choosing."""
    if not isinstance(value, str) or normalise(value) is None:
        raise InvalidOptionError(_problem("storage", "an absolute directory path that every node can reach, or a URI "
                                                     "pyarrow.fs opens (" + ", ".join(f"{scheme}://" for scheme in
                                                                                        ("file", *REMOTE_SCHEMES))
                                          + "), e.g. '/mnt/shared/checkpoints' or 's3://bucket/checkpoints'", value))


def _check_name(name: str | None) -> None:
    if name is not None and (not isinstance(name, str) or not NAME_PATTERN.match(name)):
        raise InvalidOptionError(_problem("name", "letters, digits, '-', '_' or '.', starting with a letter or "
                                                  f"digit (at most {NAME_MAX_LENGTH} characters)", name))


def _check_whole(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = f"a whole number of at least {minimum}" if minimum else "a whole number of 0 or more"
        raise InvalidOptionError(_problem(name, what, value))


def _parse_workers(text: str) -> int | tuple[int, int]:
    """``--workers 4`` or ``--workers 2:8`` (an elastic range)."""
    low, colon, high = text.partition(":")
    try:
        return (int(low), int(high)) if colon else int(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers N or a range MIN:MAX") from None


def _parse_range(text: str, what: str) -> tuple[int, int]:
    """``MIN:MAX`` of whole numbers (``--adaptive-batch 16:128``)."""
    low, colon, high = text.partition(":")
    try:
        if colon:
            return int(low), int(high)
    except ValueError:
        pass
    import argparse

    raise argparse.ArgumentTypeError(f"{text!r} is not a range MIN:MAX of {what}")


def _check_adaptive_batch(value: Any, min_workers: int) -> None:
    if value is None:
        return
    if not isinstance(value, tuple) or len(value) != 2 or value[0] > value[1] \
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise InvalidOptionError(_problem("adaptive_batch", "(min, max) per-rank batch sizes with 1 <= min <= max "
                                                            "(--adaptive-batch MIN:MAX)", value))
    if min_workers < 2:
        raise InvalidOptionError(_problem("adaptive_batch", "used with workers of 2 or more: the gradient noise "
                                                            "scale comes from comparing the ranks' gradients; "
                                                            "launch with workers=2 or more", value))


def _check_workers(value: Any) -> None:
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple):
        if len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value) \
                or value[0] > value[1]:
            raise InvalidOptionError(_problem("workers", "a whole number of at least 1, or (min, max) with "
                                                         "1 <= min <= max (--workers MIN:MAX)", value))
        return
    _check_whole("workers", value, minimum=1)


def _check_number(name: str, value: Any, what: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise InvalidOptionError(_problem(name, what, value))


def _check_loggers(value: Any) -> None:
    if value is None:
        return
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names:
        raise InvalidOptionError(_problem("loggers", "a list of names from " + ", ".join(map(repr, LOGGER_CHOICES)),
                                          value))
    for name in names:
        _check_choice("loggers", name, LOGGER_CHOICES)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidOptionError(_problem(name, "one of " + ", ".join(repr(c) for c in choices), value))


def _check_mapping(name: str, value: Any, values_are_text: bool) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidOptionError(_problem(name, "a dict with text keys", value))
    for key, item in value.items():  # the first bad entry is named, not the whole (maybe huge) dict
        if not isinstance(key, str):
            raise InvalidOptionError(_problem(name, "a dict with text keys", {key: item}))
        if values_are_text and not isinstance(item, str):
            raise InvalidOptionError(_problem(name, "a dict of text values (environment variables are text)",
                                              {key: item}))


def _check_env(env: dict[str, str] | None) -> None:
    for key, value in (env or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidOptionError(_problem("env", "variable names without '=' or NUL, and values without NUL",
                                              {key: value}))


def _check_datasets(datasets: dict[str, Any] | None) -> None:
    """Each value a Ray Dataset; ``ray.data`` is not imported for this (a Dataset's module is loaded already)."""
    if not datasets:
        return
    dataset_type = getattr(sys.modules.get("ray.data"), "Dataset", None)
    for key, value in datasets.items():
        if dataset_type is None or not isinstance(value, dataset_type):
            raise InvalidOptionError(_problem("datasets", f"a dict of Ray Datasets (ray.data.Dataset), but "
                                                          f"{key!r} is a {type(value).__name__}", value))
