"""IPython magics: ``%ray_connect``, ``%%ray_train``, ``%ray_status``, ``%ray_attach``, ``%ray_stop``.

They parse and delegate: every run goes through :func:`nbtrain.launch`, every
view through the dashboard. Misuse raises ``UsageError`` with the fix, which
IPython prints as one line instead of a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbtrain._client.connecting import connection
from nbtrain._client.entry.connect import connect
from nbtrain._client.kernel.progress_line import progress_line
from nbtrain._client.kernel.shell import without_comment
from nbtrain._client.kernel.widget_messages import join_serving_widgets
from nbtrain._client.launching.serialization import check_values
from nbtrain._exceptions import NbtrainError, RunFailedError, SweepFailedError
from nbtrain._packing import shipping
from nbtrain._packing.code_origin import cell_name
from nbtrain._packing.script import ScriptProgram
from nbtrain._views.cell_program import CellProgram, imported_modules, referenced_names
from nbtrain._views.connect_token import token_from_flags
from nbtrain._views.magic_flags import (
    options_from_args,
    run_option_flags,
    sweep_option_flags,
    sweep_options_from_args,
)


def _ends_the_cell(error: NbtrainError, tracebacks_shown: bool = False) -> NbtrainError:
    """``error`` (a public ``RunFailedError`` / ``SweepFailedError``) ending a blocking cell, so Run All stops:
    IPython prints its name and message, which hold the ranks' tracebacks from the user's first line, and
    none of nbtrain's frames. ``tracebacks_shown``: the cell's dashboard already shows each failing rank's
    traceback in its log pane, so the cell says which ranks failed and how, once, and where to look; the
    error itself keeps the whole message (``str(error)``)."""
    lines = [f"{type(error).__name__}: {error.message}"]
    if tracebacks_shown:
        first, *rest = error.message.splitlines() or [""]
        lines = [f"{type(error).__name__}: {first}", *(line for line in rest if re.match(r"Rank \d+ ", line)),
                 "Each failing rank's traceback is in the dashboard above, in its log (marked failed)."]
    error._render_traceback_ = lambda: lines  # type: ignore[attr-defined]
    return error


@magics_class
class NbtrainMagics(Magics):
    """The nbtrain magics; ``%load_ext nbtrain`` registers them."""

    # ------------------------------------------------------------------ %ray_connect
    @magic_arguments()
    @argument("address", nargs="?", default=None,
              help="ray://host:10001 (the cluster's Ray Client server), or host:6379 (its GCS) or auto "
                   "for a kernel on a node of the cluster (default: $RAY_ADDRESS, else the embedded local cluster)")
    @argument("--token-file", default=None, metavar="PATH",
              help="read the cluster's token from this file (e.g. a copy of `ray get-auth-token` output) "
                   "(default: the token kept for this address, else $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or "
                   "~/.ray/auth_token)")
    @argument("--ask-token", action="store_true", help="ask for the token at a hidden prompt")
    @argument("--token", default=None,
              help="the token itself; it is then saved in the notebook and IPython's history: prefer the above "
                   "(default: as --token-file)")
    @argument("--num-cpus", type=int, default=None,
              help="CPUs of the local cluster, when this starts it (default: the machine's)")
    @argument("--num-gpus", type=int, default=None,
              help="GPUs of the local cluster, when this starts it (default: those Ray detects)")
    @argument("--no-warm", action="store_true",
              help="do not warm the first run's ranks in the background on the local cluster (default: warm them)")
    @argument("--warm-idle-s", type=float, default=None, metavar="S",
              help="how long those warmed ranks wait, idle, for a run (default: 600)")
    @line_magic
    def ray_connect(self, line: str) -> Any:
        """Connect this notebook to a Ray cluster (default: an embedded local one on 127.0.0.1).

        A cluster with token authentication (RAY_AUTH_MODE=token) needs its token.
        Whatever is on the magic's line is saved in the notebook and in IPython's
        history, so give it with --token-file PATH, --ask-token (a hidden prompt)
        or $RAY_AUTH_TOKEN in the kernel's environment rather than --token. Once
        the cluster accepts it, the token is kept for that address only, and a
        later ``%ray_connect ADDRESS`` needs none.

        Example::

            In [1]: %ray_connect
            Local Ray cluster ready at 127.0.0.1:41837 (Ray Client: ray://127.0.0.1:41901) (11.2 s)
            In [2]: %ray_connect ray://head.example.com:10001 --token-file ~/.ray/head_token
            In [3]: %ray_connect auto          # JupyterLab on the cluster's head: a Ray driver, no Ray Client
        """
        args = self._parse(self.ray_connect, line)
        if args is None:
            return None
        token = token_from_flags(args)
        try:
            cluster = connect(args.address, token=token, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                              progress=progress_line(sys.stdout), warm=not args.no_warm,
                              warm_idle_s=args.warm_idle_s)
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        print(f"Connected: {cluster.describe()}")
        return None

    # ------------------------------------------------------------------ %%ray_train
    @magic_arguments()
    @argument("--out", "-o", default=None, metavar="VAR",
              help="store the Run in this notebook variable, else find it later with nbtrain.attach(name) "
                   "(default: none)")
    @argument("--args", default=None, metavar="ARGS",
              help='a pasted script\'s sys.argv[1:] on the ranks, as one quoted string: --args "--epochs 5" '
                   '(default: none)')
    @run_option_flags
    @line_cell_magic
    def ray_train(self, line: str, cell: str | None = None) -> Any:
        """Run this cell's body on every DDP worker; the output becomes the run's live dashboard.

        Inside the cell: ``config``, ``rank``, ``world_size``, ``device`` and the
        ``nbtrain`` worker API; notebook names the cell uses are sent along. The cell's
        ``__name__`` is ``"__main__"``, so a pasted script's ``if __name__ == "__main__":``
        block runs (``--args`` gives its ``sys.argv``).
        Blocks until the run ends (interrupt ■ stops it) unless ``--bg``.
        Every option of ``nbtrain.launch()`` is a flag (listed below).

        As a line magic it runs a script as torchrun does (``nbtrain.launch_script``): the
        options before the script, the script's own arguments after it.

        Example::

            In [3]: %%ray_train --workers 2 --config lr=0.01 epochs=3 --out run
               ...: model = nbtrain.prepare_model(Net())
               ...: for epoch in range(config["epochs"]):
               ...:     for x, y in nbtrain.prepare_loader(loader):
               ...:         ...
               ...:         nbtrain.report(loss=loss.item())

            In [4]: %ray_train --workers 2 train.py --epochs 5
        """
        from nbtrain._client.entry.launch import start
        from nbtrain._client.run.following import block_until_done

        options_line, script, script_args = (line, None, []) if cell is not None else _split_at_script(line)
        args = self._parse(self.ray_train, options_line)
        if args is None:
            return None
        if cell is None and script is None:
            raise UsageError("%ray_train needs a script: %ray_train --workers 2 train.py --epochs 5 (or %%ray_train "
                             "with the training code in the cell).")
        if cell is not None and not cell.strip():
            msg = "The %%ray_train cell is empty: put the per-worker training code below the magic line."
            raise UsageError(msg)
        if args.out is not None and not args.out.isidentifier():
            raise UsageError(f"--out needs a Python variable name, got {args.out!r}.")
        if args.resume and not args.name:
            raise UsageError("--resume continues an existing run: name it with --name NAME.")
        if script is not None and (args.args is not None or args.config):
            raise UsageError("A script's arguments follow it: %ray_train --workers 2 train.py --epochs 5 (--args and "
                             "--config are for a %%ray_train cell).")
        try:
            options = options_from_args(args, self.shell.user_ns)
            program: ScriptProgram | CellProgram
            if script is not None:
                program = ScriptProgram.of(script, script_args)
                if options.name is None:
                    options = dataclasses.replace(options, name=program.default_run_name())
            else:
                program = self._cell(line, cell or "", args)
            connection.current()
            run = start(program, dataclasses.replace(options, wait=False))
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        if args.out:
            self.shell.user_ns[args.out] = run
        if not options.wait:
            run.dashboard()
            return None
        view = run.dashboard(follow="background")
        try:
            block_until_done(run, launched=True, view_thread=view.thread)
        except KeyboardInterrupt:
            return None  # the helper stopped the run and said so
        try:
            run.raise_if_failed()
        except RunFailedError as error:
            raise _ends_the_cell(error, tracebacks_shown=getattr(view, "shows_tracebacks", False)) from None
        return None

    def _cell(self, line: str, cell: str, args: Any) -> CellProgram:
        source = self.shell.transform_cell(cell)
        try:
            captured = referenced_names(source, self.shell.user_ns)
        except SyntaxError as exc:
            raise UsageError(f"The %%ray_train cell has a syntax error on line {exc.lineno}: {exc.msg}.") from None
        check_values(captured)
        shipping.import_local_modules(imported_modules(source))
        given = args.args or ""
        if len(given) >= 2 and given[0] == given[-1] and given[0] in "'\"":
            given = given[1:-1]  # IPython's parser keeps a quoted flag value's quotes
        try:
            argv = tuple(shlex.split(given))
        except ValueError as exc:
            raise UsageError(f"--args {args.args!r} cannot be split as a shell would: {exc}.") from None
        return CellProgram(source, captured, cell_name(), f"%%ray_train {line}", argv=argv)

    # ------------------------------------------------------------------ %%ray_tune
    @magic_arguments()
    @argument("--out", "-o", default=None, metavar="VAR",
              help="store the Sweep in this notebook variable, else find it later with nbtrain.attach_sweep(name) "
                   "(default: none)")
    @sweep_option_flags
    @cell_magic
    def ray_tune(self, line: str, cell: str) -> Any:
        """Sweep this cell's hyperparameters with Ray Tune: each trial runs the cell on its own DDP ranks.

        The cell is the training code, as in ``%%ray_train``; ``config`` holds the
        trial's sampled values. The output becomes the sweep's live dashboard.
        Blocks until the sweep ends (interrupt ■ stops it) unless ``--bg``. Every
        option of ``nbtrain.tune()`` and every run option a trial takes is a flag.

        Example::

            In [3]: %%ray_tune --samples 16 --scheduler asha --metric loss --mode min --space lr=choice:0.01,0.1
               ...: for epoch in range(10):
               ...:     ...
               ...:     nbtrain.report(loss=loss.item())
        """
        from nbtrain._client.entry.sweep_start import start_sweep

        args = self._parse(self.ray_tune, line)
        if args is None:
            return None
        if not cell.strip():
            raise UsageError("The %%ray_tune cell is empty: put the per-worker training code below the magic line.")
        if args.out is not None and not args.out.isidentifier():
            raise UsageError(f"--out needs a Python variable name, got {args.out!r}.")
        source = self.shell.transform_cell(cell)
        try:
            captured = referenced_names(source, self.shell.user_ns)
        except SyntaxError as exc:
            raise UsageError(f"The %%ray_tune cell has a syntax error on line {exc.lineno}: {exc.msg}.") from None
        try:
            options, run_options = sweep_options_from_args(args, self.shell.user_ns)
            connection.current()
            check_values(captured)
            shipping.import_local_modules(imported_modules(source))
            sweep = start_sweep(CellProgram(source, captured, cell_name(), f"%%ray_tune {line}"),
                                dataclasses.replace(options, wait=False), run_options)
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        if args.out:
            self.shell.user_ns[args.out] = sweep
        view = sweep.dashboard()
        if not options.wait:
            return None
        try:
            join_serving_widgets(view.thread)
        except KeyboardInterrupt:
            print(f"Stopping sweep {sweep.name!r}…")
            print(f"Sweep {sweep.name!r} {sweep.stop()}.")
            return None
        try:
            sweep.raise_if_failed()
        except SweepFailedError as error:
            raise _ends_the_cell(error) from None
        return None

    # ------------------------------------------------------------------ %ray_status
    @magic_arguments()
    @line_magic
    def ray_status(self, line: str) -> None:
        """Cluster resources, nodes, warm workers, sweeps, and the runs on the cluster.

        Example::

            In [4]: %ray_status
            127.0.0.1:41837 (local): 1 node(s), CPU 2/4 used
            cifar   running    attempt 1  step 120/400
        """
        from nbtrain._client.entry.launch import runs
        from nbtrain._client.entry.sweep import sweeps

        if self._parse(self.ray_status, line) is None:
            return
        try:
            cluster = connection.current()
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        print(cluster.describe())
        for node in cluster.nodes():
            role = "head" if node["head"] else "worker"
            print(f"  node {node['address']} ({role}, {'alive' if node['alive'] else 'dead'}): "
                  f"{node['cpus']:g} CPU, {node['gpus']:g} GPU")
        _print_warm_workers()
        for sweep in sweeps():
            best = "" if sweep["best"] is None else f", best {sweep['metric']} {sweep['best']:.4g}"
            print(f"sweep {sweep['name']}: {sweep['state']}, {sweep['trials']} trials{best} "
                  f"(nbtrain.attach_sweep({sweep['name']!r}))")
        found = runs()
        if not found:
            print("No runs on this cluster yet.")
            return
        print(f"{'run':<32} {'state':<11} {'attempt':>7} {'step':>10}  owner")
        for info in found:
            total = f"/{info['total_steps']}" if info.get("total_steps") else ""
            owner = (info.get("owner") or {}).get("notebook") or ""
            print(f"{info['name']:<32} {info['state']:<11} {info.get('attempt', ''):>7} "
                  f"{str(info.get('step', '')) + total:>10}  {owner}")

    # ------------------------------------------------------------------ %ray_attach
    @magic_arguments()
    @argument("name", help="the run's name (see %%ray_status)")
    @argument("--out", "-o", default=None, metavar="VAR",
              help="store the Run in this notebook variable, else find it later with nbtrain.attach(name) "
                   "(default: none)")
    @line_magic
    def ray_attach(self, line: str) -> None:
        """Re-open a run's live dashboard (after a kernel restart, or from another notebook).

        Example::

            In [1]: %load_ext nbtrain
            In [2]: %ray_connect
            In [3]: %ray_attach cifar --out run
        """
        from nbtrain._client.entry.launch import attach

        args = self._parse(self.ray_attach, line)
        if args is None:
            return None
        try:
            run = attach(args.name)
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        if args.out:
            self.shell.user_ns[args.out] = run
        run.dashboard()

    # ------------------------------------------------------------------ %ray_stop
    @magic_arguments()
    @argument("name", nargs="?", default=None,
              help="run to stop; default: the last run started, forked or attached here")
    @line_magic
    def ray_stop(self, line: str) -> None:
        """Stop a run (all workers stopped, resources freed).

        Example::

            In [5]: %ray_stop cifar
            Run 'cifar' stopped.
        """
        from nbtrain._client.entry.launch import attach
        from nbtrain._client.run.handle import last_run_here

        args = self._parse(self.ray_stop, line)
        if args is None:
            return None
        try:
            run = attach(args.name) if args.name else last_run_here()
            if run is None:
                raise UsageError("Which run? Give its name: %ray_stop NAME (see %ray_status).")
            state = run.stop()
        except NbtrainError as exc:
            raise UsageError(str(exc)) from None
        print(f"Run {run.name!r} {state.value}.")

    # ------------------------------------------------------------------ parsing
    def _parse(self, magic: Any, line: str) -> Any:
        """Parsed options, or ``None`` after printing usage for ``--help``/``-h``. A trailing ``# comment`` is
        the user's note, as users paste magics from docs: it is not an argument."""
        line = without_comment(line)
        tokens = line.split()
        if "--help" in tokens or "-h" in tokens:
            print(magic.__doc__)
            return None
        try:
            return parse_argstring(magic, line)
        except UsageError as exc:
            raise UsageError(_with_suggestion(str(exc), magic, line)) from None


def _split_at_script(line: str) -> tuple[str, str | None, list[str]]:
    """``%ray_train``'s line: the options before the script (its first ``.py`` word), the script, its
    arguments after it — as torchrun's and ``%run``'s command lines read."""
    line = without_comment(line)
    try:
        words = shlex.split(line, posix=True)
    except ValueError as exc:
        raise UsageError(f"%ray_train {line!r} cannot be split as a shell would: {exc}.") from None
    at = next((index for index, word in enumerate(words) if word.endswith(".py") and not word.startswith("-")), None)
    if at is None:
        return line, None, []
    return shlex.join(words[:at]), words[at], words[at + 1:]


def _with_suggestion(message: str, magic: Any, line: str) -> str:
    parser = magic.parser
    options = [opt for action in parser._actions for opt in action.option_strings]
    hints = []
    for token in shlex.split(line, posix=True) if line else []:
        if token.startswith("--") and token.split("=")[0] not in options:
            close = difflib.get_close_matches(token.split("=")[0], options, n=1)
            if close:
                hints.append(f"did you mean {close[0]} instead of {token.split('=')[0]}?")
    name = magic.__name__
    prefix = "%%" if name in ("ray_train", "ray_tune") else "%"
    fix = f" ({'; '.join(hints)})" if hints else ""
    return f"{prefix}{name}: {message}{fix}. See `{prefix}{name} --help` for every option."


def register(ipython: Any) -> None:
    from nbtrain._views.debugging.debug_magics import DebugMagics
    from nbtrain._views.live_code_magics import LiveCodeMagics

    ipython.register_magics(NbtrainMagics)
    ipython.register_magics(DebugMagics)
    ipython.register_magics(LiveCodeMagics)


def _print_warm_workers() -> None:
    """Each notebook session's warm workers: idle ones with the time they have left."""
    from nbtrain._client.warm import is_this_session, warm_pools

    for name, workers in warm_pools().items():
        if not workers:
            continue
        whose = "this notebook" if is_this_session(name) else f"session {name.split(':', 1)[1]}"
        idle = [w for w in workers if w["state"] == "idle"]
        print(f"warm workers of {whose}: {len(idle)} idle, {len(workers) - len(idle)} in a run "
              f"(nbtrain.release_warm() ends this notebook's idle ones)")
        for worker in workers:
            left = f"exits in {worker['expires_in_s']:.0f} s" if worker["state"] == "idle" else f"in {worker['run']}"
            print(f"  pid {worker['pid']:<8} {worker['shape']:<28} {left}")
