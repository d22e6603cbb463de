"""REST API of the nbtrain server extension, under ``/nbtrain/api/``.

============================  =======================================================
``GET  runs``                 ``{"runs": [run, ...], "sweeps": [sweep, ...], "now": server_time}``
``GET  runs/<name>``          one run (404 if unknown)
``POST runs/<name>/stop``     202; the agent runs ``nbtrain stop <name> --address <its cluster>``
                              in the background (409 if it ended)
``POST runs/<name>/pause``    200 once the agent ran ``nbtrain pause <name> --address ...``
                              (the run as listed now), 409 with the tool's message
``POST runs/<name>/resume``   as ``pause``, with ``nbtrain resume``
``GET  cluster``              ``{"cluster": {...} | null}``
============================  =======================================================

Every handler is an ``APIHandler`` behind ``@web.authenticated``:
without the Jupyter token (or login cookie) every route answers 403.
A run is a registry record (:class:`nbtrain._registry.RunRecord`) with the
newest word on it, its files' or the agent's (:mod:`.run_list`; ``source``
says whose), plus ``terminal`` (whether its
state is final: the browser keeps no list of states), ``stale``, ``stop``
(see :class:`.commands.CommandRunner`), ``attach_cell`` (the cell "Open
dashboard" runs) and ``malformed`` (a record that cannot be shown, served as
an error row: :mod:`.record_checks`). The cluster has ``stale`` too. A sweep
is what its cluster lists (:func:`.run_list.served_sweeps`): state, metric,
best value and trials, each trial naming its run, which is in ``runs``.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import unquote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from nbtrain import _json
from nbtrain._lab.sidebar_agent import CommandRunner

_NAME = r"(?P<name>[^/]+)"


class _BaseHandler(APIHandler):
    @property
    def commands(self) -> CommandRunner:
        commands: CommandRunner = self.settings["nbtrain_commands"]
        return commands

    def find_run(self, name: str) -> dict[str, Any]:
        run = self.commands.run(unquote(name))
        if run is None:
            raise web.HTTPError(404, f"No run named {unquote(name)!r} in {self.commands.home / 'runs'} "
                                             "or on the clusters of its runs.")
        return run


class RunsHandler(_BaseHandler):
    @web.authenticated
    def get(self) -> None:
        runs = self.commands.runs()
        self.commands.watched(runs)
        self.finish(_json.dumps({"runs": runs, "sweeps": self.commands.sweeps(), "now": time.time()}))


class RunHandler(_BaseHandler):
    @web.authenticated
    def get(self, name: str) -> None:
        self.finish(_json.dumps(self.find_run(name)))


class StopRunHandler(_BaseHandler):
    @web.authenticated
    def post(self, name: str) -> None:
        run = self.find_run(name)
        if run["malformed"]:
            raise web.HTTPError(409, f"{run['error']} Stop it from a notebook: nbtrain.attach(NAME).stop().")
        if run["terminal"]:
            raise web.HTTPError(409, f"Run {run['name']!r} already ended ({run['state']}); nothing to stop.")
        self.set_status(202)
        self.finish(_json.dumps(self.commands.request_stop(run)))


class SteerRunHandler(_BaseHandler):
    """``POST runs/<name>/pause`` and ``.../resume``: the agent runs ``nbtrain pause|resume NAME --address A`` and
    the answer comes when it is done (a few seconds): 200 with the run as the list now shows it, or 409 with the
    tool's words (not running, already paused...)."""

    @web.authenticated
    async def post(self, name: str, verb: str) -> None:
        run = self.find_run(name)
        if run["malformed"] or run["terminal"] or not isinstance(run.get("address"), str):
            raise web.HTTPError(409, f"Run {run['name']!r} cannot be {verb}d from here ({run['state']}); "
                                     f"from a notebook: nbtrain.attach({run['name']!r}).{verb}().")
        ok, said = await self.commands.steer(run, verb)
        if not ok:
            raise web.HTTPError(409, said)
        self.finish(_json.dumps(self.commands.run(run["name"]) or run))


class ClusterHandler(_BaseHandler):
    @web.authenticated
    def get(self) -> None:
        self.finish(_json.dumps({"cluster": self.commands.cluster()}))


def setup_handlers(web_app: web.Application, commands: CommandRunner) -> None:
    web_app.settings["nbtrain_commands"] = commands
    api = url_path_join(web_app.settings["base_url"], "nbtrain", "api")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(api, "runs") + "/?", RunsHandler),
            (url_path_join(api, "runs", _NAME) + "/?", RunHandler),
            (url_path_join(api, "runs", _NAME, "stop") + "/?", StopRunHandler),
            (url_path_join(api, "runs", _NAME, r"(?P<verb>pause|resume)") + "/?", SteerRunHandler),
            (url_path_join(api, "cluster") + "/?", ClusterHandler),
        ],
    )
