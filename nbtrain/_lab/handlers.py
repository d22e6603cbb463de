"""REST API of the nbtrain server extension, under ``/nbtrain/api/``.

==========================  =======================================================
``GET  runs``               ``{"runs": [run, ...], "now": server_time}``
``GET  runs/<name>``        one run (404 if unknown)
``POST runs/<name>/stop``   202; the agent runs ``nbtrain stop <name> --address
                            <its cluster>`` in the background (409 if it ended)
``GET  cluster``            ``{"cluster": {...} | null}``
==========================  =======================================================

Every handler is an ``APIHandler`` behind ``@tornado.web.authenticated``:
without the Jupyter token (or login cookie) every route answers 403.
Run dicts are the registry files as written by the kernels, plus ``stale``
and ``stop`` (see ``_commands.CommandRunner.annotate``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from nbtrain._lab.commands import CommandRunner, NbtrainServer
from nbtrain._lab._registry_reader import is_terminal, mark_stale, read_cluster, read_run, read_runs

_NAME = r"(?P<name>[^/]+)"


class _BaseHandler(APIHandler):
    @property
    def home(self) -> Path:
        return self.settings["nbtrain_home"]

    @property
    def commands(self) -> CommandRunner:
        return self.settings["nbtrain_commands"]

    @property
    def nbtrain_settings(self) -> NbtrainServer:
        return self.settings["nbtrain_settings"]

    def present(self, run: dict[str, Any], now: float) -> dict[str, Any]:
        mark_stale(run, self.nbtrain_settings.stale_after, now)
        return self.commands.annotate(run)

    def find_run(self, name: str) -> dict[str, Any]:
        run = read_run(self.home, unquote(name))
        if run is None:
            raise tornado.web.HTTPError(404, f"No run named {unquote(name)!r} in {self.home / 'runs'}.")
        return run


class RunsHandler(_BaseHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        now = time.time()
        runs = read_runs(self.home)
        self.commands.watched(runs)
        runs = [self.present(run, now) for run in runs]
        self.finish(json.dumps({"runs": runs, "now": now}))


class RunHandler(_BaseHandler):
    @tornado.web.authenticated
    def get(self, name: str) -> None:
        self.finish(json.dumps(self.present(self.find_run(name), time.time())))


class StopRunHandler(_BaseHandler):
    @tornado.web.authenticated
    def post(self, name: str) -> None:
        run = self.find_run(name)
        if is_terminal(run):
            raise tornado.web.HTTPError(409, f"Run {run['name']!r} already ended ({run['state']}); nothing to stop.")
        self.commands.request_stop(run)
        self.set_status(202)
        self.finish(json.dumps(self.present(run, time.time())))


class ClusterHandler(_BaseHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(json.dumps({"cluster": read_cluster(self.home)}))


def setup_handlers(web_app: tornado.web.Application, commands: CommandRunner, settings: NbtrainServer) -> None:
    web_app.settings["nbtrain_home"] = commands.home
    web_app.settings["nbtrain_commands"] = commands
    web_app.settings["nbtrain_settings"] = settings
    api = url_path_join(web_app.settings["base_url"], "nbtrain", "api")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(api, "runs") + "/?", RunsHandler),
            (url_path_join(api, "runs", _NAME) + "/?", RunHandler),
            (url_path_join(api, "runs", _NAME, "stop") + "/?", StopRunHandler),
            (url_path_join(api, "cluster") + "/?", ClusterHandler),
        ],
    )
