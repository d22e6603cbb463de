"""Every sweep option, declared once (as :mod:`nbtrain._options` declares the run options).

``nbtrain.tune()`` takes these plus every run option (applied to each trial);
``%%ray_tune`` has a flag for each, generated from the declarations below. The
search space, schedulers and search algorithms are Ray Tune's own objects: a
space's values are ``ray.tune`` distributions (``tune.loguniform(1e-4, 1e-1)``),
written in the magic as ``lr=loguniform:1e-4:1e-1`` (see :func:`parse_space`).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from nbtrain._exceptions import InvalidOptionError
from nbtrain._options import NAME_PATTERN, option

SCHEDULER_CHOICES = ("fifo", "asha", "hyperband", "pbt")
MODE_CHOICES = ("min", "max")
# The magic's spelling of Ray Tune's distributions: name -> (ray.tune function, how its text is split)
DISTRIBUTIONS = {
    "uniform": "lo:hi", "loguniform": "lo:hi", "quniform": "lo:hi:q", "qloguniform": "lo:hi:q",
    "randint": "lo:hi", "randn": "mean:sd", "choice": "a,b,…", "grid": "a,b,…",
}


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What a sweep is asked to be; each trial is an nbtrain run with the run options given beside these."""

    name: str | None = option(None, "sweep name (an ended sweep's name gives NAME-2...); trial N's run is <name>-t<N>; "
                                    "default sweep-<time>", "--name", "-n", metavar="NAME")
    space: dict[str, Any] | None = option(
        None, "the search space, merged over config: ray.tune distributions by key; in the magic "
              "KEY=DIST:ARGS, e.g. --space lr=loguniform:1e-4:1e-1 momentum=uniform:0.1:0.9 "
              "opt=choice:sgd,adam lr=grid:0.001,0.01 (also quniform, qloguniform, randint, randn); "
              "a plain value is fixed", "--space", kind="space", metavar="KEY=DIST")
    metric: str | None = option(None, "the metric rank 0 reports that ranks the trials, e.g. loss", "--metric",
                                metavar="NAME")
    mode: str | None = option(None, "min or max: whether a smaller or a larger metric is better", "--mode",
                              choices=MODE_CHOICES)
    num_samples: int = option(1, "trials sampled from the space (with grid values: samples of each grid point)",
                              "--samples", parse=int)
    scheduler: Any = option(None, "asha, hyperband (asynchronous), pbt (Population Based Training: the space's "
                                  "distributions are mutated; trials must save checkpoints) or fifo (default), or "
                                  "in Python a ray.tune scheduler object (MedianStoppingRule, PopulationBasedTraining, "
                                  "…); "
                                  "synchronous HyperBand, which pauses trials, is refused",
                            "--scheduler", choices=SCHEDULER_CHOICES)
    perturbation_interval: int = option(4, "pbt: iterations (time_attr) between a trial's chances to copy a better "
                                           "trial's checkpoint and a perturbed config", "--perturbation-interval",
                                        parse=int)
    max_t: int = option(100, "asha/hyperband: the most iterations (time_attr) a trial runs", "--max-t", parse=int)
    grace_period: int = option(1, "asha: iterations every trial runs before it may be stopped", "--grace-period",
                               parse=int)
    reduction_factor: float = option(4, "asha/hyperband: 1 in reduction_factor trials goes on at each rung",
                                     "--reduction-factor", parse=float)
    time_attr: str = option("training_iteration", "what max_t and grace_period count: training_iteration (one "
                                                  "report of the metric by rank 0) or a value rank 0 reports with it, "
                                                  "e.g. epoch", "--time-attr", metavar="NAME")
    search_alg: Any = option(None, "a ray.tune search algorithm (e.g. OptunaSearch()); in the magic the name of a "
                                   "notebook variable holding one", "--search-alg", kind="variable", metavar="VAR")
    seed: int | None = option(None, "draws the space's random values the same way each time, so a sweep run again "
                                    "samples the same configs (the default search; a search_alg takes its own seed)",
                              "--seed", parse=int)
    workers_per_trial: int = option(2, "DDP ranks of each trial's run", "--workers-per-trial", parse=int)
    max_concurrent: int | None = option(None, "trials running at once (default: as many as the cluster holds)",
                                        "--max-concurrent", parse=int)
    wait: bool = option(False, "block until the sweep ends (the magic blocks unless --bg; Ctrl-C stops the sweep)",
                        "--wait", kind="flag", off_flag="--bg", magic_default=True)

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not NAME_PATTERN.match(self.name)):
            raise InvalidOptionError(problem("name", "letters, digits, '-', '_' or '.' (at most 100)", self.name))
        if not isinstance(self.space, dict) or not self.space:
            raise InvalidOptionError(problem("space", "a non-empty dict of ray.tune distributions by config key, "
                                                      "e.g. {'lr': tune.loguniform(1e-4, 1e-1)}", self.space))
        if not isinstance(self.metric, str) or not self.metric:
            raise InvalidOptionError(problem("metric", "the name of a metric rank 0 reports, e.g. 'loss'",
                                             self.metric))
        if self.mode not in MODE_CHOICES:
            raise InvalidOptionError(problem("mode", "'min' or 'max'", self.mode))
        for name, minimum in (("num_samples", 1), ("max_t", 1), ("grace_period", 1), ("workers_per_trial", 1),
                              ("perturbation_interval", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidOptionError(problem(name, f"a whole number of at least {minimum}", value))
        if self.grace_period > self.max_t:
            raise InvalidOptionError(problem("grace_period", f"at most max_t ({self.max_t})", self.grace_period))
        if isinstance(self.reduction_factor, bool) or not isinstance(self.reduction_factor, (int, float)) \
                or self.reduction_factor < 2:
            raise InvalidOptionError(problem("reduction_factor", "a number of at least 2", self.reduction_factor))
        if self.max_concurrent is not None and (not isinstance(self.max_concurrent, int) or self.max_concurrent < 1):
            raise InvalidOptionError(problem("max_concurrent", "a whole number of at least 1, or None",
                                             self.max_concurrent))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidOptionError(problem("seed", "a whole number of at least 0, or None", self.seed))
        if self.seed is not None and self.search_alg is not None:
            searcher = type(self.search_alg).__name__
            raise InvalidOptionError(problem("seed", f"left out when search_alg is given ({searcher} draws the "
                                                     "configs): give the search algorithm its own seed, e.g. "
                                                     "OptunaSearch(seed=0)", self.seed))
        if isinstance(self.scheduler, str) and self.scheduler not in SCHEDULER_CHOICES:
            raise InvalidOptionError(problem("scheduler", "one of " + ", ".join(map(repr, SCHEDULER_CHOICES)) +
                                             " or a ray.tune scheduler object", self.scheduler))
        if self.scheduler == "pbt":
            pbt_mutations(self.space)
        if not isinstance(self.time_attr, str) or not self.time_attr:
            raise InvalidOptionError(problem("time_attr", "a name, e.g. 'training_iteration'", self.time_attr))


def pbt_mutations(space: dict[str, Any]) -> dict[str, Any]:
    """What ``scheduler="pbt"`` may perturb: the space's distributions (a grid or a fixed value stays as it is)."""
    from ray.tune.search.sample import Domain

    mutable = {key: value for key, value in space.items() if isinstance(value, Domain)}
    if not mutable:
        raise InvalidOptionError(problem("scheduler", "given a space with at least one distribution when it is 'pbt' "
                                                      "(PBT perturbs them), e.g. space={'lr': tune.loguniform(1e-4, "
                                                      "1e-1)}", "pbt"))
    return mutable


def fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(SweepOptions))


def flag_of(name: str) -> str:
    return next(f for f in fields() if f.name == name).metadata["nbtrain"].flags[0]  # type: ignore[no-any-return]


def problem(name: str, what: str, got: Any) -> str:
    shown = repr(got)
    return f"{name} ({flag_of(name)}) must be {what}, got {shown if len(shown) <= 200 else shown[:199] + '…'}."


def parse_space(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """``[("lr", "loguniform:1e-4:1e-1"), ("opt", "choice:sgd,adam")]`` → Ray Tune distributions by key.

    Values are read as Python literals where they are ones (``0.1``, ``'adam'``), else kept as text;
    a value without a distribution name is fixed.
    """
    from ray import tune

    space: dict[str, Any] = {}
    for key, text in pairs:
        kind, _, rest = text.partition(":")
        if kind not in DISTRIBUTIONS:
            if ":" in text:
                msg = problem("space", f"KEY=DIST:ARGS with DIST one of {', '.join(DISTRIBUTIONS)}",
                              f"{key}={text}")
                raise InvalidOptionError(msg)
            space[key] = _literal(text)
            continue
        if kind in ("choice", "grid"):
            values = [_literal(v) for v in rest.split(",") if v != ""]
            if not values:
                raise InvalidOptionError(problem("space", f"{kind}:a,b,… with at least one value", f"{key}={text}"))
            space[key] = tune.choice(values) if kind == "choice" else tune.grid_search(values)
            continue
        numbers = rest.split(":")
        try:
            args = [float(n) for n in numbers]
        except ValueError:
            args = []
        if len(args) != DISTRIBUTIONS[kind].count(":") + 1:
            raise InvalidOptionError(problem("space", f"{kind}:{DISTRIBUTIONS[kind]} (numbers)", f"{key}={text}"))
        if kind == "randint":
            space[key] = tune.randint(int(args[0]), int(args[1]))
        else:
            space[key] = getattr(tune, kind)(*args)
    return space


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
