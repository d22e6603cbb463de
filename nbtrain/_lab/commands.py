"""Stop runs and refresh the registry from the Jupyter server, through ``nbtrain agent``.

The server never imports Ray: both go to one long-lived ``python -m nbtrain
agent`` child process (:mod:`._agent_process`) that keeps its Ray Client
connection, so a stop takes about a second once it is connected instead of a
fresh Ray Client session (20 s to over a minute) per click.

* A stop is fire-and-forget for the browser: the POST answers 202 at once and
  the outcome shows in the run list (``stop.status`` is ``stopping`` until
  the registry says the run ended, ``failed`` with the tool's message if the
  tool failed).
* The registry refresh runs only while a browser is polling, and only for the
  clusters of live runs that nobody has updated for ``refresh_after`` seconds
  (a notebook that shows a run mirrors it itself; a closed one does not). It
  always names the cluster (``--address``): the tool must never start a local
  cluster on the server's behalf. It backs off (up to ``refresh_max_backoff``)
  while the tool fails.
* While a browser watches a live run and the agent is not connected yet, the
  refresh connects it to that run's cluster ahead of time, so the first Stop
  is as quick as later ones. Once no browser has watched and nothing has used
  the agent for ``agent_idle_timeout``, it is closed (its Ray Client session
  on the cluster ends with it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from traitlets import Float, Int, List, Unicode
from traitlets.config import Configurable

from nbtrain._lab.agent_process import AgentProcess
from nbtrain._lab._registry_reader import is_terminal, number, read_runs

_OUTPUT_CHARS = 2000


class NbtrainServer(Configurable):
    """Settings of the nbtrain server extension (``c.NbtrainServer.*``)."""

    agent_command = List(
        Unicode(),
        default_value=[sys.executable, "-m", "nbtrain", "agent"],
        help="Command of the long-lived process that stops runs and refreshes the registry "
             "(it reads `nbtrain` arguments as JSON lines: see nbtrain._agent).",
    ).tag(config=True)

    # Each refresh asks every run on the cluster for its summary, so not much more often than this.
    refresh_interval = Float(
        15.0, help="Seconds between registry refreshes while a browser watches; 0 disables them."
    ).tag(config=True)

    refresh_max_backoff = Float(
        300.0, help="Longest wait between refresh attempts while the refresh command fails."
    ).tag(config=True)

    refresh_after = Float(
        10.0, help="Refresh a live run's cluster once its registry file is this many seconds old."
    ).tag(config=True)

    watch_window = Float(
        30.0, help="A browser counts as watching for this many seconds after its last poll."
    ).tag(config=True)

    command_timeout = Float(
        180.0, help="Seconds a stop or refresh may take (connecting included) before the agent is restarted."
    ).tag(config=True)

    agent_idle_timeout = Float(
        600.0, help="Close the agent (and its Ray Client session) after this many seconds without a browser or a command."
    ).tag(config=True)

    stale_after = Float(
        60.0, help="A live run whose registry file is older than this is flagged stale."
    ).tag(config=True)

    max_stop_history = Int(100, help="How many stop outcomes to remember.").tag(config=True)


class CommandRunner:
    """Stops and registry refreshes of one server, through its agent process."""

    def __init__(self, settings: NbtrainServer, home: Path, cwd: str, log: logging.Logger) -> None:
        self.settings = settings
        self.home = home
        self.cwd = cwd
        self.log = log
        self._stops: dict[str, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_watch = float("-inf")
        self._refresh_wanted = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._clusters_seen: set[str] = set()
        self._agent = AgentProcess(settings.agent_command, {**os.environ, "NBTRAIN_HOME": str(home)}, cwd)

    # -- stops ---------------------------------------------------------------

    def request_stop(self, run: dict[str, Any]) -> dict[str, Any]:
        """Have the agent run ``nbtrain stop NAME --address ADDR`` unless that run is already stopping."""
        name = run["name"]
        current = self._stops.get(name)
        if current is None or current["status"] != "stopping":
            current = {"status": "stopping", "requested": time.time(), "message": None}
            self._stops[name] = current
            command = ["stop", name]
            if isinstance(run.get("address"), str) and run["address"]:
                command += ["--address", run["address"]]
            self._spawn(self._stop(name, command, current))
        return dict(current)

    async def _stop(self, name: str, command: list[str], record: dict[str, Any]) -> None:
        began = time.monotonic()
        ok, output = await self._agent.call(command, self.settings.command_timeout)
        if ok:
            self.log.info("nbtrain: stopped run %r in %.1f s", name, time.monotonic() - began)
            self._refresh_wanted.set()
        else:
            record["status"] = "failed"
            record["message"] = output[-_OUTPUT_CHARS:] or "the stop command failed without a message"
            self.log.warning("nbtrain: stopping run %r failed: %s", name, record["message"])
        while len(self._stops) > self.settings.max_stop_history:
            self._stops.pop(next(iter(self._stops)))

    def annotate(self, run: dict[str, Any]) -> dict[str, Any]:
        """Attach what this server knows about a stop it was asked for."""
        record = self._stops.get(run["name"])
        if record is not None and is_terminal(run) and record["status"] == "stopping":
            # The registry caught up: the stop is done.
            self._stops.pop(run["name"], None)
            record = None
        run["stop"] = dict(record) if record is not None else None
        return run

    # -- registry refresh ----------------------------------------------------

    def watched(self, runs: list[dict[str, Any]]) -> None:
        """A browser asked for the runs: keep refreshing for a while, and connect the agent
        at once to the cluster of a live run it has not seen before."""
        first = time.monotonic() - self._last_watch > self.settings.watch_window
        new_clusters = {run["address"] for run in _live_with_address(runs)} - self._clusters_seen
        self._clusters_seen |= new_clusters
        self._last_watch = time.monotonic()
        if self.settings.refresh_interval <= 0:
            return
        if self._loop_task is None:
            # Started on the first poll, inside the running IOLoop.
            self._loop_task = asyncio.ensure_future(self._refresh_loop())
        if first or (new_clusters and self._agent.address is None):
            self._refresh_wanted.set()

    async def _refresh_loop(self) -> None:
        delay = self.settings.refresh_interval
        while True:
            try:
                await asyncio.wait_for(self._refresh_wanted.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass
            self._refresh_wanted.clear()
            try:
                ok, output = True, ""
                for address in self._addresses_to_refresh():
                    began = time.monotonic()
                    done, said = await self._agent.call(["runs", "--json", "--address", address],
                                                        self.settings.command_timeout)
                    self.log.info("nbtrain: refreshed runs of %s in %.1f s (%s)", address,
                                  time.monotonic() - began, "ok" if done else "failed")
                    if not done:
                        ok, output = False, said[-_OUTPUT_CHARS:]
                await self._close_idle_agent()
            except Exception:  # keep refreshing whatever one attempt ran into
                self.log.exception("nbtrain: registry refresh crashed")
                ok, output = False, ""
            if ok:
                delay = self.settings.refresh_interval
            else:
                # Not installed yet, or the cluster is unreachable: try less often.
                delay = min(max(delay * 2, self.settings.refresh_interval), self.settings.refresh_max_backoff)
                self.log.debug("nbtrain: registry refresh failed (next try in %.0f s): %s", delay, output)

    def _addresses_to_refresh(self) -> list[str]:
        """Clusters of live runs whose files nobody has updated lately, and the cluster to connect
        the agent to ahead of a stop (the newest live run's) while it is not connected."""
        if time.monotonic() - self._last_watch > self.settings.watch_window:
            return []
        now = time.time()
        live = sorted(_live_with_address(read_runs(self.home)), key=lambda run: number(run.get("updated")),
                      reverse=True)
        addresses = {run["address"] for run in live if now - number(run.get("updated")) > self.settings.refresh_after}
        if live and self._agent.address is None:
            addresses.add(live[0]["address"])
        return sorted(addresses)

    async def _close_idle_agent(self) -> None:
        unwatched = time.monotonic() - max(self._last_watch, self._agent.last_used)
        if self._agent.running and unwatched > self.settings.agent_idle_timeout:
            self.log.info("nbtrain: closing the idle agent")
            await self._agent.close()

    # -- plumbing ------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _live_with_address(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run for run in runs
            if not is_terminal(run) and isinstance(run.get("address"), str) and run["address"]]
