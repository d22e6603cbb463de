"""Magic parsing and errors, through a real IPython InteractiveShell (no cluster needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from nbtrain._views.cell_program import CellProgram, referenced_names
from nbtrain._views.magic_flags import parse_config

from _helpers import ipython_shell

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def ip():
    shell = ipython_shell()
    return shell


def _usage_error(ip, cell: str) -> str:
    result = ip.run_cell(cell)
    assert isinstance(result.error_in_exec, UsageError), f"expected a UsageError, got {result.error_in_exec!r}"
    return str(result.error_in_exec)


def test_config_values_are_parsed_as_python_literals():
    assert parse_config(["lr=0.01", "epochs=5", "opt=adam", "layers=[64, 32]", "amp=True"]) == {
        "lr": 0.01, "epochs": 5, "opt": "adam", "layers": [64, 32], "amp": True}


@pytest.mark.parametrize("bad", ["lr", "=3", "2x=1"])
def test_bad_config_pairs_say_the_expected_form(bad):
    with pytest.raises(UsageError, match=re.escape("key=value pairs like `--config lr=0.01 epochs=5`")):
        parse_config([bad])


def test_unknown_option_suggests_the_right_one(ip):
    message = _usage_error(ip, "%%ray_train --wrokers 2\nx = 1\n")
    assert "unrecognized arguments: --wrokers" in message
    assert "did you mean --workers" in message
    assert "%%ray_train --help" in message


def test_bad_value_names_the_option(ip):
    message = _usage_error(ip, "%%ray_train --workers two\nx = 1\n")
    assert "argument --workers/-w: 'two' is not a number of workers N or a range MIN:MAX" in message


@pytest.mark.parametrize("line,expected", [
    ("--workers 0", "workers (--workers) must be a whole number of at least 1, got 0"),
    ("--stall-timeout -1", "stall_timeout_s (--stall-timeout) must be a positive number of seconds"),
    ("--backend nccl", "backend (--backend) must be 'gloo' on a run without GPUs"),
    ("--env A=1 --datasets train=nowhere", "--datasets names the notebook variable 'nowhere', which is not defined"),
    ("--out 1run", "--out needs a Python variable name"),
    ("--on-stall explode", "invalid choice: 'explode'"),
    ("--workers 3:2", "workers (--workers) must be a whole number of at least 1, or (min, max) with 1 <= min <= max"),
])
def test_invalid_values_are_usage_errors(ip, line, expected):
    assert expected in _usage_error(ip, f"%%ray_train {line}\nx = 1\n")


def test_empty_cell_and_syntax_errors_are_reported_before_launch(ip):
    assert "cell is empty" in _usage_error(ip, "%%ray_train --workers 2\n\n")
    assert "syntax error on line 2" in _usage_error(ip, "%%ray_train --workers 2\nx = 1\ny = (\n")


def test_running_without_a_connection_says_to_connect(ip):
    import nbtrain
    from nbtrain._client.connecting import connection

    previous = connection._current  # the session cluster, when cluster tests ran before this one
    nbtrain.disconnect()
    try:
        message = _usage_error(ip, "%%ray_train --workers 2\nx = 1\n")
        assert "Not connected to a Ray cluster. Run `nbtrain.connect()` (or `%ray_connect`) first." in message
        if previous is not None:  # once nbtrain connected, a stray Ray call raises instead of starting a cluster
            import ray

            with pytest.raises(Exception, match=r"before ray\.init\(\)"):
                ray.available_resources()
            assert not ray.is_initialized()
    finally:
        if previous is not None:
            nbtrain.connect(previous.address, progress=lambda msg: None)


def test_help_prints_usage_with_an_example(ip, capsys):
    for magic in ("%%ray_train --help\nx = 1\n", "%ray_connect --help", "%ray_attach -h", "%ray_stop --help",
                  "%ray_status --help"):
        result = ip.run_cell(magic)
        assert result.error_in_exec is None
    out = capsys.readouterr().out
    for option in ("--workers", "--cpus-per-worker", "--gpus-per-worker", "--config", "--name", "--max-failures",
                   "--bg", "--out"):
        assert option in out
    assert "Example::" in out and "In [3]: %%ray_train --workers 2" in out


def test_ray_stop_without_a_name_or_run_says_which(ip):
    from nbtrain._client.run import handle

    handle._made_here.clear()  # a kernel that has started, forked or attached no run
    assert "Which run? Give its name" in _usage_error(ip, "%ray_stop")


def test_only_the_names_the_cell_uses_are_captured():
    import threading

    namespace = {"model_cls": object, "LR": 0.1, "helper": len, "big_frame": list(range(10)),
                 "lock": threading.Lock(), "np": pytest, "_private": 1, "In": []}
    source = "m = model_cls()\nx = helper([LR])\nimport math\ny = np.approx(1)\n"
    assert set(referenced_names(source, namespace)) == {"model_cls", "LR", "helper", "np"}


def test_names_that_shadow_builtins_or_start_with_an_underscore_are_captured():
    import builtins

    namespace = {"input": 3, "id": builtins.id, "_scale": 2, "__name__": "__main__", "filter": "mine"}
    source = "x = input * _scale\ny = id(x)\nz = filter\nw = __name__\n"
    assert referenced_names(source, namespace) == {"input": 3, "_scale": 2, "filter": "mine"}


def test_cell_program_defines_config_and_returns_result():
    program = CellProgram("result = config['a'] * 2", {})
    assert program.source == "result = config['a'] * 2"
    with pytest.raises(SyntaxError):
        CellProgram("x = (", {})


def test_a_worker_range_makes_an_elastic_run():
    from IPython.core.magic_arguments import parse_argstring

    from nbtrain._views.magic_flags import options_from_args
    from nbtrain._views.magics import NbtrainMagics

    args = parse_argstring(NbtrainMagics.ray_train, "--workers 1:4 --scale-lr sqrt --resize-interval 5")
    options = options_from_args(args, {})
    assert (options.workers, options.elastic) == ((1, 4), True)
    assert (options.scale_lr, options.resize_interval_s) == ("sqrt", 5.0)



def test_adaptive_batch_flags_parse_into_the_options():
    from IPython.core.magic_arguments import parse_argstring

    from nbtrain import InvalidOptionError
    from nbtrain._views.magic_flags import options_from_args
    from nbtrain._views.magics import NbtrainMagics

    args = parse_argstring(NbtrainMagics.ray_train, "--workers 2 --gns --adaptive-batch 16:128")
    options = options_from_args(args, {})
    assert (options.gns, options.adaptive_batch) == (True, (16, 128))
    with pytest.raises(InvalidOptionError, match=r"adaptive_batch \(--adaptive-batch\) must be used with "
                                                         r"workers of 2 or more"):
        options_from_args(parse_argstring(NbtrainMagics.ray_train, "--workers 1 --adaptive-batch 16:128"), {})


MAGICS_WITH_HELP = ("%%ray_train --help\nx = 1\n", "%%ray_tune --help\nx = 1\n", "%ray_connect --help",
                    "%ray_attach --help", "%ray_stop --help", "%ray_status --help", "%ray_debug --help")
# what argparse prints when a lone % in a help text is read as a format code: its action's dict, or a lost word
GARBLED = re.compile(r"option_strings|'prog':|[^%r]ay_(debug|status|train|connect)")


def test_every_magics_help_reads_as_written(ip, capsys):
    for magic in MAGICS_WITH_HELP:
        result = ip.run_cell(magic)
        assert result.error_in_exec is None, (magic, result.error_in_exec)
        out = capsys.readouterr().out
        assert not GARBLED.search(out), (magic, out)
    ip.run_cell("%%ray_train --help\nx = 1\n")
    assert "for %ray_debug / run.debug()" in capsys.readouterr().out


def test_every_cli_commands_help_reads_as_written():
    import argparse

    from nbtrain._client.entry.cli import build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    texts = [parser.format_help(), *(sub.format_help() for sub in commands.choices.values())]
    assert len(texts) > 5
    for text in texts:
        assert "option_strings" not in text and "'prog':" not in text, text


def _magics() -> dict[str, Any]:
    """Every magic ``%load_ext nbtrain`` registers, by name: the method whose declared arguments parse its line."""
    from nbtrain._views.debugging.debug_magics import DebugMagics
    from nbtrain._views.live_code_magics import LiveCodeMagics
    from nbtrain._views.magics import NbtrainMagics

    found = {}
    for magics in (NbtrainMagics, DebugMagics, LiveCodeMagics):
        for kind in ("line", "cell"):
            found.update({name: getattr(magics, attr) for name, attr in magics.magics[kind].items()})
    return found


DOCS = Path(__file__).resolve().parent.parent / "docs"
MAGIC_LINE = re.compile(r"(%%?)(ray_\w+)(.*)$")


def _examples() -> list[tuple[str, str, str]]:
    """(where, magic, its line) for every magic example a user can copy: the ``In [n]:`` lines of the magics'
    docstrings (what docs/reference/magics.rst shows), the magic lines of the docs' code blocks, and the docs'
    inline code that gives a magic with arguments."""
    examples = []
    for name, method in sorted(_magics().items()):
        for line in (method.__doc__ or "").splitlines():
            if found := re.match(r"\s*In \[\d+\]: " + MAGIC_LINE.pattern, line):
                examples.append((f"%{name}'s docstring", found.group(2), found.group(3).strip()))
    for page in sorted([*DOCS.glob("*.md"), DOCS.parent / "README.md"]):
        fence = None
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if opened := re.match(r"\s*(```+|~~~+)(\S*)", line):
                fence = None if fence is not None else opened.group(2)
            elif fence in ("python", "ipython", "text") and (found := MAGIC_LINE.match(line.strip())):
                examples.append((f"{page.name}:{number}", found.group(2), found.group(3).strip()))
        for found in re.finditer(r"`(%%?)(ray_\w+)\s([^`]+)`", page.read_text(encoding="utf-8")):
            examples.append((f"{page.name} (inline)", found.group(2), " ".join(found.group(3).split())))
    return examples


def test_the_examples_cover_every_magic_and_the_docs():
    examples = _examples()
    assert {magic for _, magic, _ in examples} == set(_magics()), "a magic without an example"
    assert sum(1 for where, _, _ in examples if where.endswith(".md (inline)")) > 10


@pytest.mark.parametrize(("where", "magic", "line"), _examples())
def test_every_magic_example_in_the_docs_parses_as_written(ip, where, magic, line):
    """What each magic does with its line before it acts (a trailing ``# comment`` dropped, then its declared
    arguments), so an example a user pastes from the docs never fails on its syntax."""
    from nbtrain._client.kernel.shell import without_comment
    from nbtrain._views.magics import _split_at_script

    method = _magics()[magic]
    options = _split_at_script(line)[0] if magic == "ray_train" else without_comment(line)
    assert parse_argstring(method, options) is not None, where


def test_a_trailing_comment_is_the_users_note_not_an_argument():
    from nbtrain._client.kernel.shell import without_comment

    assert without_comment("auto          # JupyterLab on the head") == "auto"
    assert without_comment("ray://h:1 --token a#b") == "ray://h:1 --token a#b"
    assert without_comment("--args '--tag #3' train.py") == "--args '--tag #3' train.py"
    assert without_comment("# all of it") == ""


def test_a_live_runs_magics_take_a_trailing_comment_too():
    from nbtrain._views.live_code_magics import LiveCodeMagics, _parsed

    parsed = _parsed(LiveCodeMagics.ray_exec, "%%ray_exec", "cifar --ranks 0,1  # both ranks")
    assert (parsed.name, parsed.ranks) == ("cifar", "0,1")
