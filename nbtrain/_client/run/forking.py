"""``run.fork()``: a new run that starts from another run's checkpoint with a changed config.

The parent's supervisor (or, once it ended, its files) answers with the parent's launch — the pickled
function and its options, kept in the run's directory — and the checkpoint (its latest, or the latest
kept at or before a step). The new run starts by the path every run takes
(:mod:`~nbtrain._client.launching.starting`: the same checks, uploads, room for Ray Data, and ``NAME-2`` for an
ended run's name; the parent's ``runtime_env`` folders uploaded again, see :func:`_runtime_env`), as if its
ranks had saved that checkpoint themselves: their ``load_checkpoint()`` returns it.
It records its parent and the step. ``_client/launching`` imports nothing of ``_client/run``: the start path hands
back the supervisor's handle, and this module makes the fork's ``Run`` of it.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import cloudpickle

from nbtrain import _options
from nbtrain._client.launching import starting
from nbtrain._cluster.commands import ADJUSTABLE, PATCH, checked_settings
from nbtrain._cluster.spec import RunSpec
from nbtrain._exceptions import InvalidOptionError, NbtrainError
from nbtrain._options import RunOptions, check_keywords
from nbtrain._packing.runtime_env import places

FORK_READ_S = 120.0  # the checkpoint travels through the notebook: large ones take a while


def fork(parent: Any, *, step: int | None, config: dict[str, Any] | None, name: str | None,
         train_fn: Callable[..., Any] | None, patches: bool, options: dict[str, Any]) -> Any:
    """The forked :class:`~nbtrain.Run` (typed ``Any``: ``run`` imports this module's caller)."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise InvalidOptionError(f"run.fork(step=...) is a step (0 or more) or None for the latest, not {step!r}.")
    if config is not None and not isinstance(config, dict):
        raise InvalidOptionError(f"run.fork(config=...) is a dict of the values to change, not {config!r}.")
    check_keywords(options, [field.name for field in _options.fields()
                            if field.name not in ("name", "config", "resume", "wait")],
                   "run.fork()", "nbtrain.launch")
    spec_bytes, source = parent._call("fork_source", step, timeout=FORK_READ_S)
    if isinstance(source, str):
        raise NbtrainError(f"Run {parent.name!r} cannot be forked: {source}")
    if spec_bytes is None and train_fn is None:
        raise NbtrainError(f"Run {parent.name!r} kept no copy of its launch (an older nbtrain started it): give the "
                           "function, run.fork(train_fn=train, ...).")
    launched: RunSpec | None = cloudpickle.loads(spec_bytes) if spec_bytes is not None else None
    base = launched.options if launched is not None else RunOptions()
    chosen = dataclasses.replace(base, name=name or f"{parent.name}-fork-{time.strftime('%H%M%S')}",
                                 config={**(base.config or {}), **(config or {})}, resume=False, wait=False,
                                 **{"runtime_env": _runtime_env(parent.name, launched), **options})
    _check_datasets(parent.name, launched, chosen)
    if train_fn is not None:
        code = starting.Code.of(train_fn)
    else:
        assert launched is not None
        code = starting.Code(launched.fn_bytes, launched.modules, launched.fn_takes_config)
    meta, data = source
    settings = _optimizer_settings(parent, config or {})
    note = (f"forked from {parent.name} at step {meta['step']}"
            + (f" with {', '.join(f'{k}={v!r}' for k, v in (config or {}).items())}" if config else ""))
    checked = starting.checked_spec(code, chosen, notes=(note,), named=True,
                                    initial_checkpoint=({**meta, "from_run": parent.name}, data),
                                    parent={"run": parent.name, "step": meta["step"]},
                                    settings_at_start=settings or None,
                                    patches_at_start=_patches(parent) if patches else ())
    handle, spec = starting.start(checked)
    return type(parent)(spec.name, handle, checked.address)


def _patches(parent: Any) -> tuple[str, ...]:
    """The sources of the parent's patches that applied, in order: the fork's code is patched as the parent's was."""
    return tuple(change["args"]["source"] for change in parent.changes
                 if change["kind"] == PATCH and change["step"] is not None)


def _runtime_env(parent: str, launched: RunSpec | None) -> dict[str, Any] | None:
    """The parent's ``runtime_env`` for the fork. Its folders were uploaded for the parent, and Ray deletes an
    upload once no live process names it (the parent's supervisor held them until it ended): where the folders
    the parent was launched from are on this machine, the fork uploads them again (the same content is the same
    package, sent once); else the parent's uploads, if the cluster still has them; else a refusal that says what
    to give."""
    from nbtrain._ray_compat import uploads_missing

    if launched is None:
        return None
    uploaded = launched.options.runtime_env
    given = getattr(launched, "runtime_env_given", None)  # a run launched by an older nbtrain has none
    if given and all(os.path.exists(place) for place in places(given) if "://" not in place):
        return dict(given)
    missing = uploads_missing(places(uploaded))
    if missing:
        folders = ", ".join(places(given)) or ", ".join(missing)
        raise NbtrainError(f"The runtime_env folders of run {parent!r} ({folders}) were uploaded for it, and the "
                           "cluster dropped the upload once the run ended; they are not on this machine to send "
                           "again: give them to the fork, run.fork(runtime_env={'working_dir': ...}).")
    return uploaded


def _check_datasets(parent: str, launched: RunSpec | None, chosen: RunOptions) -> None:
    """A run's Ray Datasets are kept nowhere (they travel beside its spec, as the notebook's objects): a fork of a
    run launched with ``datasets=`` is given them again, each name the parent's ranks read."""
    wanted = getattr(launched, "dataset_names", ())
    missing = sorted(set(wanted) - set(chosen.datasets or {}))
    if missing:
        listed = ", ".join(f"{key!r}: ..." for key in missing)
        msg = (f"Run {parent!r} was launched with datasets= ({', '.join(missing)}), which a run does not keep: give "
               f"them to the fork again, run.fork(datasets={{{listed}}}, ...).")
        raise InvalidOptionError(msg)


def _optimizer_settings(parent: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The fork's config values that set the optimizer (``lr``, ``momentum``, ...), checked as ``adjust()`` checks
    them: a training function that restores its optimizer from the checkpoint gets the parent's values back, so
    nbtrain applies these before the fork's first update. Keys it cannot apply are named in a warning."""
    settings = checked_settings({key: value for key, value in config.items() if key in ADJUSTABLE},
                                "run.fork(config={{'{name}': ...}})")
    others = sorted(key for key in config if key not in ADJUSTABLE)
    steered = bool(parent._fresh_summary().get("hyper"))  # the optimizer settings its ranks last said
    if settings and not steered:
        warnings.warn(f"run.fork(config=...): {', '.join(settings)} cannot be applied to the fork's optimizer: "
                      f"run {parent.name!r} gives nbtrain no optimizer (nbtrain.prepare_optimizer / steerable). "
                      "They reach the ranks as config values only; an optimizer restored from the checkpoint keeps "
                      "the parent's.", UserWarning, stacklevel=4)
    if others:
        warnings.warn(f"run.fork(config=...): {', '.join(others)} reach the ranks as config values only: nbtrain "
                      f"applies {', '.join(ADJUSTABLE)} to the restored optimizer, but not these, so they take "
                      "effect only where the training function reads config (a value restored from the checkpoint "
                      "wins).", UserWarning, stacklevel=4)
    return settings
