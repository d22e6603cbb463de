"""Jupyter server extension behind the JupyterLab "Ray Training" sidebar.

Enabled by ``etc/jupyter/jupyter_server_config.d/nbtrain.json`` (shipped in
the wheel). It serves the run registry (:mod:`nbtrain._registry`) overlaid
with what a ``python -m nbtrain agent`` child process last reported of each
run's cluster, over an authenticated REST API (:mod:`nbtrain._lab.handlers`),
and hands stops to the same agent, so the server itself never imports Ray or
torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbtrain._lab"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from nbtrain._lab.handlers import setup_handlers
    from nbtrain._lab.sidebar_agent import CommandRunner, NbtrainServer
    from nbtrain._paths import nbtrain_home

    settings = NbtrainServer(config=serverapp.config, parent=serverapp)
    commands = CommandRunner(settings, nbtrain_home(), serverapp.root_dir, serverapp.log)
    setup_handlers(serverapp.web_app, commands)
    serverapp.log.info("nbtrain: serving the run registry in %s at /nbtrain/api/", commands.home)
