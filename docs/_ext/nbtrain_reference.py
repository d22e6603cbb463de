"""References generated from nbtrain's own declarations, so they cannot drift from the code.

Each ``*_rst()`` function returns reStructuredText; a directive of the same name puts it
in a page (``.. nbtrain-run-options::`` in ``reference/options.rst``...):

- ``nbtrain-run-options``: :class:`nbtrain._options.RunOptions`, the one declaration of the
  run options that ``launch()``, ``%%ray_train``'s flags and the launch panel are made from;
- ``nbtrain-sweep-options``: :class:`nbtrain._sweep_options.SweepOptions` (``tune()``, ``%%ray_tune``);
- ``nbtrain-magics``: each magic's docstring and its own arguments, from its IPython parser;
- ``nbtrain-cli``: the ``nbtrain`` command's subcommands, from ``build_parser()``;
- ``nbtrain-rest-routes``: the lab server's routes, from ``setup_handlers`` and the table in
  ``nbtrain._lab.handlers``' docstring (a route missing from the table fails the build);
- ``nbtrain-errors``: every :class:`nbtrain.NbtrainError` subclass with its docstring.

``tests/test_docs.py`` calls these functions to check that nothing is left out.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

# --------------------------------------------------------------------------- text helpers
_ROLE = re.compile(r":[a-z]+:`~?\.?([^`<]+?)(?:\s*<[^>]+>)?`")


def literal_roles(text: str) -> str:
    """Cross-references to nbtrain's private modules (``:class:`.run_list```...) as plain literals."""
    return _ROLE.sub(lambda m: f"``{m.group(1).strip()}``", text)


def escape(text: str) -> str:
    """Help text as reST: `x` becomes a literal, markup characters are taken as they are."""
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"``{part.strip('`')}``")
        else:
            out.append(re.sub(r"([\\*|`]|_(?=\W|$))", r"\\\1", part))
    return "".join(out)


def code(text: Any) -> str:
    return f"``{text}``" if str(text) else ""


def list_table(header: list[str], rows: Iterable[list[str]], widths: str = "auto") -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [header, *rows]:
        for i, cell in enumerate(row):
            cell_lines = (cell or "\\ ").splitlines() or ["\\ "]
            lines.append(("   * - " if i == 0 else "     - ") + cell_lines[0])
            lines.extend("       " + more for more in cell_lines[1:])
    return [*lines, ""]


# --------------------------------------------------------------------------- run and sweep options
def _option_rows(fields: list[Any], info: Callable[[Any], Any], magic_default: Callable[[Any], Any]) -> list[list[str]]:
    rows = []
    for field in fields:
        meta = info(field)
        flags = ", ".join(code(flag) for flag in meta.flags)
        if meta.kind == "flag":
            flags += ", " + code(meta.off_flag or "--no-" + meta.flags[0][2:])
        if meta.metavar:
            flags += f" ``{meta.metavar}``"
        default = code(repr(field.default))
        if magic_default(field) != field.default:
            default += f" (the magic: {code(repr(magic_default(field)))})"
        help_text = escape(meta.help)
        if meta.choices:
            help_text += "; one of " + ", ".join(code(choice) for choice in meta.choices)
        rows.append([code(field.name), flags, default, code(meta.kind), help_text])
    return rows


def run_options_rst() -> list[str]:
    from nbtrain import _options

    usual = [field for field in _options.fields() if not _options.info(field).tuning]
    tuning = [field for field in _options.fields() if _options.info(field).tuning]
    header = ["option (``launch()``)", "flag (``%%ray_train``)", "default", "kind", "what it does"]
    lines = list_table(header, _option_rows(usual, _options.info, _options.magic_default_of), "15 20 12 8 45")
    note = _options.TUNING_NOTE
    lines += [".. rubric:: Tuning options", "", escape(note[0].upper() + note[1:]) + ".", ""]
    lines += list_table(header, _option_rows(tuning, _options.info, _options.magic_default_of), "15 20 12 8 45")
    return lines


def sweep_options_rst() -> list[str]:
    from nbtrain import _options, _sweep_options

    header = ["option (``tune()``)", "flag (``%%ray_tune``)", "default", "kind", "what it does"]
    return list_table(header, _option_rows(_sweep_options.fields(), _options.info, _options.magic_default_of),
                      "15 20 12 8 45")


# --------------------------------------------------------------------------- magics
def magics() -> list[tuple[str, Any]]:
    """``(spelling, function)`` of every magic ``%load_ext nbtrain`` registers, line magics first."""
    from nbtrain._views.debugging.debug_magics import DebugMagics
    from nbtrain._views.magics import NbtrainMagics

    found = []
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for cls in (NbtrainMagics, DebugMagics):
            for name, attribute in cls.magics[kind].items():
                found.append((prefix + name, getattr(cls, attribute)))
    return found


DEFAULT_IN_HELP = re.compile(r"\s*\(default:? ([^()]*)\)")  # "the node's CPUs (default: 1)"
DEFAULT_AFTER = re.compile(r";\s*default:? ([^()]*)\)")  # "(implies --live; default: ...)"


def default_of(action: argparse.Action, *, strict: bool) -> tuple[str, str]:
    """What an argument is when it is left out, and its help without that: ``("off", "ask the cluster")``.

    An argument whose default is ``None`` means something the code decides later ("this machine's CPUs");
    its help says what, as ``(default: ...)``, and that moves to the default column. ``strict``: every
    argument must say one (the CLI's do); else such an argument's column stays empty (a magic's ``--out``).
    """
    help_text = action.help or ""
    said = []
    for clause in help_text.split("; "):  # "start: the head's CPUs (default: ...); add-node: the node's (default 1)"
        label = re.match(r"(?!default:)([\w-]+(?: / [\w-]+)*): ", clause)  # the action it is for: "add-node: "
        for found in DEFAULT_IN_HELP.findall(clause) + re.findall(r"^default:? ([^()]*)\)", clause):
            said.append(f"{label.group(1)}: {found.strip()}" if label else found.strip())
    if said:
        return "; ".join(said), DEFAULT_AFTER.sub(")", DEFAULT_IN_HELP.sub("", help_text))
    if not action.option_strings and action.nargs in (argparse.REMAINDER, "*"):
        return "none", help_text
    if not action.option_strings and action.nargs != "?":
        return "required", help_text
    if isinstance(action, argparse._StoreTrueAction):
        return "off", help_text
    if isinstance(action, argparse._StoreFalseAction):
        return "on", help_text
    if action.default in (None, argparse.SUPPRESS):
        if not strict:
            return "", help_text
        raise ValueError(f"{'/'.join(action.option_strings)} has no default and its help does not say what "
                         "leaving it out does: end the help with '(default: ...)'")
    return code(repr(action.default)), help_text


def _argument_rows(parser: argparse.ArgumentParser, skip: set[str], *, strict: bool = False) -> list[list[str]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in skip:
            continue
        name = ", ".join(code(flag) for flag in action.option_strings) or code(action.metavar or action.dest)
        default, help_text = default_of(action, strict=strict)
        help_text = escape(help_text)
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            help_text += ("; " if help_text else "") + "one of " + ", ".join(code(choice) for choice in action.choices)
        rows.append([name, default, help_text])
    return rows


def magics_rst() -> list[str]:
    from nbtrain import _options, _sweep_options

    run_options = {field.name for field in _options.fields()}
    sweep_options = {field.name for field in _sweep_options.fields()}
    lines: list[str] = []
    for spelling, magic in magics():
        parser = magic.parser
        lines += [spelling, "-" * len(spelling), "", ".. code-block:: text", ""]
        usage = [line for line in parser.format_usage().splitlines() if line.strip() not in ("", "::")]
        lines += ["   " + line for line in textwrap.dedent("\n".join(usage)).splitlines()]
        lines += ["", literal_roles(inspect.cleandoc(parser.description or "")), ""]
        own = _argument_rows(parser, run_options | sweep_options, strict=True)
        if own:
            lines += list_table(["argument", "default", "what it does"], own, "25 15 60")
        if {action.dest for action in parser._actions} & sweep_options:
            lines += ["Every :ref:`sweep option <sweep-options>` is a flag too, and so is every "
                      ":ref:`run option <run-options>` a trial takes.", ""]
        elif {action.dest for action in parser._actions} & run_options:
            lines += ["Every :ref:`run option <run-options>` is a flag too.", ""]
    return lines


# --------------------------------------------------------------------------- the nbtrain command
def cli_subcommands() -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Each subcommand of ``nbtrain``: its one-line help and its parser."""
    from nbtrain._client.entry.cli import build_parser

    subparsers = next(action for action in build_parser()._actions
                      if isinstance(action, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    return {name: (helps.get(name, ""), parser) for name, parser in subparsers.choices.items()}


def cli_rst() -> list[str]:
    lines: list[str] = []
    for name, (help_text, parser) in cli_subcommands().items():
        title = f"nbtrain {name}"
        lines += [title, "-" * len(title), "", escape(help_text[:1].upper() + help_text[1:]) + ".", ""]
        if parser.description:
            lines += [escape(parser.description), ""]
        lines += [".. code-block:: text", ""]
        lines += ["   " + line for line in parser.format_usage().replace("usage: ", "").strip().splitlines()]
        lines += [""]
        rows = _argument_rows(parser, set(), strict=True)
        if rows:
            lines += list_table(["argument", "default", "what it does"], rows, "25 15 60")
    return lines


# --------------------------------------------------------------------------- the lab server's REST API
def rest_routes() -> list[str]:
    """The routes ``setup_handlers`` registers, relative to ``/nbtrain/api/`` (``runs/<name>/pause``...)."""
    from nbtrain._lab import handlers

    source = inspect.getsource(handlers.setup_handlers)
    routes = []
    for args in re.findall(r"url_path_join\(api, ([^)]*)\)", source):
        parts = [part.strip().strip("r").strip("\"'") for part in args.split(",")]
        parts = ["<name>" if part == "_NAME" else re.sub(r"\(\?P<\w+>([^)]*)", r"\1", part) for part in parts]
        route = "/".join(parts).replace("(", "").replace(")", "")
        head, _, last = route.rpartition("/")
        routes.extend(f"{head}/{each}" if head else each for each in last.split("|"))  # pause|resume: two routes
    return routes


def rest_rst() -> list[str]:
    from nbtrain._lab import handlers

    doc = inspect.cleandoc(handlers.__doc__ or "")
    listed = re.findall(r"``(?:GET|POST|PUT|DELETE|PATCH) +([^`]+)``", doc)
    missing = [route for route in rest_routes() if route not in listed]
    if missing:
        msg = f"nbtrain._lab.handlers' docstring table does not list {missing}: add them there"
        raise ValueError(msg)
    first, _, rest = doc.partition("\n\n")
    return [literal_roles(first), "", *literal_roles(rest).splitlines(), ""]


# --------------------------------------------------------------------------- errors
def error_classes() -> list[type[Exception]]:
    """``NbtrainError`` and every subclass of it, root first, then as ``nbtrain._exceptions`` declares them."""
    import nbtrain
    from nbtrain import _exceptions

    found: list[type[Exception]] = []
    todo: list[type[Exception]] = [nbtrain.NbtrainError]
    while todo:
        cls = todo.pop(0)
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    order = list(vars(_exceptions))
    return sorted(found, key=lambda cls: order.index(cls.__name__) if cls.__name__ in order else len(order))


def errors_rst() -> list[str]:
    import nbtrain

    lines: list[str] = []
    for cls in error_classes():
        public = getattr(nbtrain, cls.__name__, None) is cls
        title = f"{cls.__name__}"
        lines += [f".. _error-{cls.__name__}:", "", title, "-" * len(title), ""]
        bases = [base.__name__ for base in cls.__bases__ if base is not object]
        ref = f":exc:`nbtrain.{cls.__name__}`" if public else code(f"{cls.__module__}.{cls.__name__}")
        lines += [f"{ref} (a {', '.join(code(base) for base in bases)})", ""]
        cause, _, remedy = literal_roles(inspect.cleandoc(cls.__doc__ or "")).partition("What to do:")
        lines += [cause.strip(), ""]
        if remedy:
            lines += ["**What to do:** " + remedy.strip(), ""]
    return lines


# --------------------------------------------------------------------------- Sphinx
GENERATORS: dict[str, Callable[[], list[str]]] = {
    "nbtrain-run-options": run_options_rst,
    "nbtrain-sweep-options": sweep_options_rst,
    "nbtrain-magics": magics_rst,
    "nbtrain-cli": cli_rst,
    "nbtrain-rest-routes": rest_rst,
    "nbtrain-errors": errors_rst,
}


SOURCES = ("_options.py", "_sweep_options.py", "_exceptions.py", "_views/magics.py", "_views/magic_flags.py",
           "_views/debugging/debug_magics.py", "_client/entry/cli.py", "_lab/handlers.py")


def _directive(generate: Callable[[], list[str]]) -> type[SphinxDirective]:
    class Generated(SphinxDirective):
        has_content = False

        def run(self) -> list[nodes.Node]:
            for module in SOURCES:  # an edit there rebuilds the page
                self.env.note_dependency(str(self.env.srcdir.parent / "nbtrain" / module))
            container = nodes.container()
            lines = [piece for line in generate() for piece in line.split("\n")]  # docstrings come as one string
            nested_parse_with_titles(self.state, StringList(lines, source=self.name), container)
            return container.children

    return Generated


def _public_name(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    """A type hint names a public class where it is defined (``nbtrain._client.run.handle.Run``): link it to
    ``nbtrain.Run``. A private name with no public one stays unresolved (and fails the nitpicky build)."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("nbtrain._") or not (public := _exported(target)):
        return None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"], public, node, contnode)


_PRIVATE_ROLE = re.compile(r":[a-z]+:`~?(\.[\w.]+|nbtrain\._[\w.]+)`")


def _private_refs_as_literals(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A public docstring's reference to one of nbtrain's private modules or helpers (``:mod:`.sharded_sampling```)
    reads as a literal: private names have no page. A private name that is exported (``nbtrain._client.run.handle.Run``)
    stays a reference and links to its public entry."""
    def literal(match: re.Match[str]) -> str:
        target = match.group(1)
        if target.startswith("nbtrain._") and _exported(target):
            return match.group(0)
        return f"``{target.lstrip('.').rsplit('.', 1)[-1] if target.startswith('.') else target}``"

    lines[:] = [_PRIVATE_ROLE.sub(literal, line) for line in lines]


def _exported(target: str) -> str | None:
    """``nbtrain.Run`` for ``nbtrain._client.run.handle.Run``: the public name of a private one, if it has one."""
    module_name, _, short = target.rpartition(".")
    for public_module in ("nbtrain", "nbtrain.lightning", "nbtrain.huggingface"):
        public = importlib.import_module(public_module)
        if short in public.__all__ and getattr(getattr(public, short), "__module__", None) == module_name:
            return f"{public_module}.{short}"
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    for name, generate in GENERATORS.items():
        app.add_directive(name, _directive(generate))
    app.connect("missing-reference", _public_name)
    app.connect("autodoc-process-docstring", _private_refs_as_literals)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
