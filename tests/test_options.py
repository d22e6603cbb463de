"""Every run option is declared once (nbtrain._options) and every face agrees with that declaration."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from IPython.core.error import UsageError

import nbtrain
from nbtrain import _options
from nbtrain._options import RunOptions

from _helpers import ipython_shell

pytestmark = pytest.mark.quick

DECLARED = {field.name: field for field in _options.fields()}


def test_launch_takes_every_option_with_the_declared_default():
    parameters = dict(inspect.signature(nbtrain.launch).parameters)
    parameters.pop("train_fn")
    assert sorted(parameters) == sorted(DECLARED), "launch() and RunOptions list different options"
    for name, parameter in parameters.items():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, f"{name} should be keyword-only"
        assert parameter.default == DECLARED[name].default, f"launch({name}=) defaults differ from RunOptions"


def test_launch_docstring_lists_every_option_and_its_flag():
    for name, field in DECLARED.items():
        assert f"{name}={field.default!r}" in nbtrain.launch.__doc__
        assert _options.info(field).flags[0] in nbtrain.launch.__doc__


@pytest.fixture(scope="module")
def train_parser():
    from nbtrain._views.magics import NbtrainMagics

    return NbtrainMagics.ray_train.parser


def test_every_option_has_a_ray_train_flag_with_the_declared_default(train_parser):
    by_dest = {action.dest: action for action in train_parser._actions if action.option_strings}
    for name, field in DECLARED.items():
        assert name in by_dest, f"{name} has no %%ray_train flag"
        expected = field.default if name != "wait" else True  # the magic blocks unless --bg: its nature
        assert by_dest[name].default == expected, f"--{name}: the magic's default differs from RunOptions"
    assert _options.info(DECLARED["wait"]).magic_default is True
    assert [name for name, field in DECLARED.items() if _options.info(field).magic_default is not None] == ["wait"]


def test_help_lists_every_flag():
    shell = ipython_shell()
    result = shell.run_cell("%%ray_train --help\nx = 1\n")
    assert result.error_in_exec is None
    from nbtrain._views.magics import NbtrainMagics

    doc = NbtrainMagics.ray_train.__doc__
    for field in DECLARED.values():
        assert _options.info(field).flags[0] in doc
    assert "--bg" in doc and "--out" in doc


def test_panel_fields_are_declared_options():
    from nbtrain._views import launch_panel

    labelled = {field.name for field in _options.panel_fields()}
    assert labelled == {"name", "workers", "cpus_per_worker", "gpus_per_worker", "max_failures"}
    assert labelled | {"config", "wait"} == launch_panel._FORM_OPTIONS
    assert set(DECLARED) >= launch_panel._FORM_OPTIONS


def test_flags_parse_into_the_same_options_as_launch_keywords(train_parser):
    from nbtrain._views.magic_flags import options_from_args

    line = ("--workers 3 --cpus-per-worker 0.5 --name exp.1 --config lr=0.1 tags=['a'] --env OMP_NUM_THREADS=1 "
            "--stall-timeout 30 --on-stall restart --placement-strategy SPREAD --flush-interval 0.5 --bg "
            "--no-checkpoint-weights-only --datasets train=ds --logger tensorboard,mlflow --logger-dir /tmp/logs "
            "--precision bf16-mixed")
    import ray.data

    dataset = ray.data.Dataset.__new__(ray.data.Dataset)  # a Dataset's type is all the check reads
    dataset._current_executor = None  # what a Dataset that never ran holds (its __del__ reads it)
    options = options_from_args(train_parser.parse_args(line.split()), {"ds": dataset})
    assert options == RunOptions(workers=3, cpus_per_worker=0.5, name="exp.1", config={"lr": 0.1, "tags": ["a"]},
                                 env={"OMP_NUM_THREADS": "1"}, stall_timeout_s=30.0, on_stall="restart",
                                 placement_strategy="SPREAD", flush_interval_s=0.5, wait=False,
                                 checkpoint_weights_only=False, datasets={"train": dataset},
                                 loggers=("tensorboard", "mlflow"), logger_dir="/tmp/logs", precision="bf16-mixed")


@pytest.mark.parametrize("bad,expected", [
    ({"workers": 0}, "workers (--workers) must be a whole number of at least 1, got 0."),
    ({"workers": True}, "workers (--workers) must be a whole number"),
    ({"cpus_per_worker": 0}, "cpus_per_worker (--cpus-per-worker) must be a positive number"),
    ({"gpus_per_worker": -1}, "gpus_per_worker (--gpus-per-worker) must be 0 or more"),
    ({"max_failures": -1}, "max_failures (--max-failures) must be a whole number of 0 or more"),
    ({"on_stall": "explode"}, "on_stall (--on-stall) must be one of 'warn', 'fail', 'restart'"),
    ({"placement_strategy": "pack"}, "placement_strategy (--placement-strategy) must be one of 'PACK'"),
    ({"flush_interval_s": 0}, "flush_interval_s (--flush-interval) must be between 0.01 and 10 seconds"),
    ({"backend": "nccl"}, "backend (--backend) must be 'gloo' on a run without GPUs"),
    ({"env": {"A": 1}}, "env (--env) must be a dict of text values"),
    ({"config": [1]}, "config (--config) must be a dict with text keys"),
    ({"name": "bad name"}, "name (--name) must be letters, digits"),
    ({"total_steps": 0}, "total_steps (--total-steps) must be a whole number of at least 1"),
])
def test_bad_options_name_the_parameter_and_its_flag(bad, expected):
    with pytest.raises(nbtrain.NbtrainError) as error:
        RunOptions(**bad)
    assert expected in str(error.value)


def test_bad_launch_keywords_fail_before_anything_is_sent():
    """Validation happens in RunOptions, before launch() needs a cluster."""
    with pytest.raises(nbtrain.NbtrainError, match=r"workers \(--workers\)"):
        nbtrain.launch(lambda: None, workers=0)


def test_options_are_one_frozen_value():
    options = RunOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.workers = 4  # type: ignore[misc]


def test_a_bad_magic_value_is_a_usage_error_naming_the_flag():
    shell = ipython_shell()
    result = shell.run_cell("%%ray_train --flush-interval 0\nx = 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "flush_interval_s (--flush-interval) must be between 0.01 and 10 seconds" in str(result.error_in_exec)


def test_a_numbered_name_near_the_length_limit_is_still_a_valid_name():
    """A 99-character name of an ended run: its next run failed once "-2" made it 101 characters long."""
    from nbtrain._client.launching.checks import numbered_name
    from nbtrain._options import NAME_MAX_LENGTH, NAME_PATTERN

    for name in ("r" * (NAME_MAX_LENGTH - 1), "r" * NAME_MAX_LENGTH):
        first = numbered_name(name, set())
        assert first == "r" * (NAME_MAX_LENGTH - 2) + "-2" and NAME_PATTERN.match(first)
        second = numbered_name(name, {first})
        assert second == "r" * (NAME_MAX_LENGTH - 2) + "-3" and NAME_PATTERN.match(second)
    assert numbered_name("short", {"short-2"}) == "short-3"
