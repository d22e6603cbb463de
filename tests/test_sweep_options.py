"""Sweep options are declared once (nbtrain._sweep_options); tune() and %%ray_tune agree with them, and bad
input is refused at once, naming the option, before anything reaches a cluster."""

from __future__ import annotations

import inspect
import time

import pytest
from IPython.core.error import UsageError
from ray import tune

import nbtrain
from nbtrain import _sweep_options
from nbtrain._sweep_options import SweepOptions

from _helpers import ipython_shell

pytestmark = pytest.mark.quick

DECLARED = {field.name: field for field in _sweep_options.fields()}


def _noop(config):
    pass


def test_tune_takes_every_sweep_option_with_the_declared_default():
    parameters = dict(inspect.signature(nbtrain.tune).parameters)
    parameters.pop("train_fn")
    parameters.pop("run_options")
    assert sorted(parameters) == sorted(DECLARED)
    for name, parameter in parameters.items():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default == DECLARED[name].default, f"tune({name}=) defaults differ from SweepOptions"


@pytest.fixture(scope="module")
def tune_parser():
    from nbtrain._views.magics import NbtrainMagics

    return NbtrainMagics.ray_tune.parser


def test_the_magic_has_a_flag_for_every_sweep_option_and_every_trial_run_option(tune_parser):
    from nbtrain import _options
    from nbtrain._client.entry.sweep import SET_BY_THE_SWEEP

    dests = {action.dest for action in tune_parser._actions if action.option_strings}
    assert set(DECLARED) <= dests
    assert {f.name for f in _options.fields() if f.name not in SET_BY_THE_SWEEP} <= dests
    assert not ({"workers", "resume"} & dests)  # set by the sweep; warm workers are a trial run option


def test_flags_parse_into_sweep_options_and_trial_run_options(tune_parser):
    from nbtrain._views.magic_flags import sweep_options_from_args

    search = object()
    line = ("--samples 16 --scheduler asha --metric loss --mode min --space lr=loguniform:1e-4:1e-1 "
            "momentum=uniform:0.1:0.9 opt=choice:sgd,adam bs=grid:32,64 layers=2 --workers-per-trial 2 "
            "--max-t 10 --grace-period 1 --reduction-factor 2 --search-alg searcher --bg "
            "--cpus-per-worker 0.5 --config epochs=3 --max-failures 1")
    options, run_options = sweep_options_from_args(tune_parser.parse_args(line.split()), {"searcher": search})
    assert (options.num_samples, options.scheduler, options.metric, options.mode) == (16, "asha", "loss", "min")
    assert (options.max_t, options.grace_period, options.reduction_factor) == (10, 1, 2.0)
    assert options.search_alg is search and options.wait is False and options.workers_per_trial == 2
    space = options.space
    assert type(space["lr"]).__name__ == "Float" and (space["lr"].lower, space["lr"].upper) == (1e-4, 1e-1)
    assert "LogUniform" in type(space["lr"].get_sampler()).__name__
    assert space["opt"].categories == ["sgd", "adam"]
    assert space["bs"] == {"grid_search": [32, 64]}
    assert space["layers"] == 2
    assert run_options == {"cpus_per_worker": 0.5, "config": {"epochs": 3}, "max_failures": 1}


@pytest.mark.parametrize("arguments,expected", [
    ({"space": {}}, "space (--space) must be a non-empty dict"),
    ({"space": None}, "space (--space) must be a non-empty dict"),
    ({"mode": "minimize"}, "mode (--mode) must be 'min' or 'max', got 'minimize'"),
    ({"mode": None}, "mode (--mode) must be 'min' or 'max'"),
    ({"metric": ""}, "metric (--metric) must be the name of a metric rank 0 reports"),
    ({"num_samples": 0}, "num_samples (--samples) must be a whole number of at least 1, got 0"),
    ({"workers_per_trial": 0}, "workers_per_trial (--workers-per-trial) must be a whole number of at least 1"),
    ({"scheduler": "pbt2"}, "scheduler (--scheduler) must be one of 'fifo', 'asha', 'hyperband', 'pbt'"),
    ({"scheduler": "pbt", "space": {"lr": tune.grid_search([0.1, 0.2])}},
     "scheduler (--scheduler) must be given a space with at least one distribution when it is 'pbt'"),
    ({"perturbation_interval": 0}, "perturbation_interval (--perturbation-interval) must be a whole number of at "
                                   "least 1, got 0"),
    ({"grace_period": 20, "max_t": 10}, "grace_period (--grace-period) must be at most max_t (10)"),
    ({"reduction_factor": 1}, "reduction_factor (--reduction-factor) must be a number of at least 2"),
    ({"name": "a b"}, "name (--name) must be letters, digits"),
    ({"seed": -1}, "seed (--seed) must be a whole number of at least 0, or None, got -1"),
    ({"seed": 0, "search_alg": object()}, "seed (--seed) must be left out when search_alg is given (object draws "
                                          "the configs): give the search algorithm its own seed"),
])
def test_bad_sweep_options_name_the_option_within_a_second(arguments, expected):
    good = {"space": {"lr": tune.uniform(0, 1)}, "metric": "loss", "mode": "min"}
    started = time.monotonic()
    with pytest.raises(nbtrain.InvalidOptionError) as error:
        nbtrain.tune(_noop, **{**good, **arguments})
    assert expected in str(error.value)
    assert time.monotonic() - started < 1.0


def test_a_run_option_the_sweep_sets_itself_is_refused_with_what_to_use():
    with pytest.raises(nbtrain.InvalidOptionError, match="workers is set by the sweep for each trial; use "
                                                         "workers_per_trial"):
        nbtrain.tune(_noop, space={"lr": tune.uniform(0, 1)}, metric="loss", mode="min", workers=4)


def test_synchronous_hyperband_is_refused_naming_what_works():
    from ray.tune.schedulers import HyperBandScheduler

    with pytest.raises(nbtrain.InvalidOptionError, match=r"pauses trials.*Use scheduler='hyperband'"):
        nbtrain.tune(_noop, space={"lr": tune.uniform(0, 1)}, metric="loss", mode="min",
                     scheduler=HyperBandScheduler())


@pytest.mark.parametrize("space,expected", [
    ("lr=lognormal:1:2", "KEY=DIST:ARGS with DIST one of uniform, loguniform"),
    ("lr=uniform:0.1", "uniform:lo:hi (numbers)"),
    ("lr=uniform:a:b", "uniform:lo:hi (numbers)"),
    ("lr=choice:", "choice:a,b,… with at least one value"),
])
def test_an_unknown_or_malformed_distribution_in_the_magic_is_a_usage_error(space, expected):
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "nbtrain")
    result = shell.run_cell(f"%%ray_tune --metric loss --mode min --space {space}\nx = 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert expected in str(result.error_in_exec)
    assert "space (--space)" in str(result.error_in_exec)


def test_sweep_options_are_frozen_values():
    options = SweepOptions(space={"lr": 0.1}, metric="loss", mode="max")
    with pytest.raises(AttributeError):
        options.metric = "acc"  # type: ignore[misc]


def _each_trial(config):
    pass


def test_a_seed_draws_the_same_configs_each_time_and_none_leaves_the_search_as_given():
    from nbtrain._cluster.sweep.sweep_supervisor import search_algorithm

    space = {"lr": tune.grid_search([0.1, 0.2]), "momentum": tune.uniform(0.1, 0.9)}

    def drawn(seed):
        search = search_algorithm(SweepOptions(space=space, metric="loss", mode="min", num_samples=2, seed=seed))
        search.add_configurations({"sweep": {"run": _each_trial, "config": space, "num_samples": 2}})
        configs = []
        while (trial := search.next_trial()) is not None:
            configs.append(trial.config)
        return configs

    assert len(drawn(7)) == 4 and drawn(7) == drawn(7)
    assert drawn(7) != drawn(8)
    searcher = object()
    assert search_algorithm(SweepOptions(space=space, metric="loss", mode="min", search_alg=searcher)) is searcher
