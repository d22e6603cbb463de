"""Jupyter server extension behind the JupyterLab "Ray Training" sidebar.

Enabled by ``etc/jupyter/jupyter_server_config.d/nbtrain.json`` (shipped in
the wheel). It serves the on-disk run registry over an authenticated REST API
(see :mod:`nbtrain._lab.handlers`) and hands stops and registry refreshes
to a ``python -m nbtrain agent`` child process, so the server itself never
imports Ray or torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbtrain._lab"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from nbtrain._lab.commands import CommandRunner, NbtrainServer
    from nbtrain._lab._registry_reader import registry_home
    from .handlers import setup_handlers

    settings = NbtrainServer(config=serverapp.config, parent=serverapp)
    commands = CommandRunner(settings, registry_home(), serverapp.root_dir, serverapp.log)
    setup_handlers(serverapp.web_app, commands, settings)
    serverapp.log.info("nbtrain: serving the run registry in %s at /nbtrain/api/", commands.home)
