"""The sidebar's data and its Stop, from the Jupyter server, through ``nbtrain agent``.

The server never imports Ray: it asks one long-lived ``python -m nbtrain
agent`` child process (:mod:`.agent_process`) that keeps its Ray Client
connection, so a stop or a refresh takes about a second once it is connected
instead of a fresh Ray Client session (20 s to over a minute) per command.

* **Refresh.** While a browser watches (it polled ``runs`` within
  ``watch_window``), every ``refresh_interval`` seconds the agent is asked
  ``runs --json --address A`` for each cluster ``A`` with a live run (or, with
  none live, for the cluster a notebook last connected to). Its answer is kept
  in memory and, with the runs' own files (read on every request, cluster up
  or down), is what the sidebar shows (:mod:`.run_list`); nothing is written.
  A cluster whose refresh fails is asked again less and less often
  (doubling up to ``refresh_max_backoff``) while the others keep their pace.
  The address is always given: the tool must never start a local cluster on
  the server's behalf.
* **Connecting ahead.** The first poll of a browser, and a poll that shows a
  live run on a cluster not seen before, refresh at once: the agent connects
  to that cluster then, so the first Stop is as quick as later ones. Once no
  browser has watched and nothing has used the agent for
  ``agent_idle_timeout``, it is closed (its Ray Client session ends with it).
* **Stop** is fire-and-forget for the browser: the POST answers 202 at once
  and the outcome shows in the run list (``stop.status`` is ``stopping``
  until the run is terminal, ``failed`` with the tool's message if the tool
  failed). A stop that worked refreshes its cluster at once.
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

from nbtrain._client.run_index import read_files
from nbtrain._lab.agent_process import AgentProcess
from nbtrain._lab.run_list import ClusterAnswers, served_cluster, served_runs, served_sweeps
from nbtrain._registry import read_cluster, read_runs

_OUTPUT_CHARS = 2000


class NbtrainServer(Configurable):
    """Settings of the nbtrain server extension (``c.NbtrainServer.*``)."""

    agent_command = List(
        Unicode(),
        default_value=[sys.executable, "-m", "nbtrain", "agent"],
        help="Command of the long-lived process that stops runs and reports what clusters run "
             "(it reads `nbtrain` arguments as JSON lines: see nbtrain._client.agent).",
    ).tag(config=True)

    # Notebooks do not report runs to the server: a watched sidebar is as current as this.
    # Each refresh asks every run on the cluster for its summary (one round of calls).
    refresh_interval = Float(
        3.0, help="Seconds between refreshes of each cluster with a live run while a browser watches; "
                  "0 disables them (the sidebar then shows what launch() recorded, and stops)."
    ).tag(config=True)

    refresh_max_backoff = Float(
        120.0, help="Longest wait between refresh attempts of a cluster while its refresh fails."
    ).tag(config=True)

    watch_window = Float(
        30.0, help="A browser counts as watching for this many seconds after its last poll."
    ).tag(config=True)

    command_timeout = Float(
        180.0, help="Seconds a stop or refresh may take (connecting included) before the agent is restarted."
    ).tag(config=True)

    agent_idle_timeout = Float(
        600.0, help="Close the agent (and its Ray Client session) after this many seconds "
                    "without a browser or a command."
    ).tag(config=True)

    stale_after = Float(
        60.0, help="A live run whose newest information is older than this is flagged stale."
    ).tag(config=True)

    max_stop_history = Int(100, help="How many stop outcomes to remember.").tag(config=True)


class CommandRunner:
    """The runs and cluster one server shows, kept current (and stopped) through its agent."""

    def __init__(self, settings: NbtrainServer, home: Path, cwd: str, log: logging.Logger) -> None:
        self.settings = settings
        self.home = home
        self.cwd = cwd
        self.log = log
        self.answers = ClusterAnswers()
        self._stops: dict[str, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_watch = float("-inf")
        self._refresh_wanted = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._clusters_seen: set[str] = set()
        self._retry: dict[str, tuple[float, float]] = {}  # failing address -> (delay, monotonic time of next try)
        self._agent = AgentProcess(settings.agent_command, {**os.environ, "NBTRAIN_HOME": str(home)}, cwd)

    # -- what the sidebar shows ------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        """Every run, live first: registry records with the agent's newest word on each, and ``stop``."""
        return [self._annotate(run) for run in self._served_runs()]

    def run(self, name: str) -> dict[str, Any] | None:
        return next((run for run in self.runs() if run["name"] == name), None)

    def sweeps(self) -> list[dict[str, Any]]:
        """Every sweep the clusters' latest answers list, with its trials (:func:`.run_list.served_sweeps`)."""
        return served_sweeps(self.answers, time.time(), self.settings.stale_after)

    def cluster(self) -> dict[str, Any] | None:
        return served_cluster(read_cluster(self.home), self.answers, time.time(), self.settings.stale_after)

    def _served_runs(self) -> list[dict[str, Any]]:
        cluster = read_cluster(self.home)
        registry = read_runs(self.home)
        files, clusters = read_files(registry, self.home)  # at once, cluster up or down
        embedded = {address for address, seen in clusters.items() if seen.started is not None}
        return served_runs(registry, self.answers, time.time(), self.settings.stale_after,
                           current=cluster["address"] if cluster is not None else None, files=files,
                           embedded=embedded)

    async def refresh(self, address: str) -> tuple[bool, str]:
        """Ask the agent what cluster ``address`` runs and keep its answer; (it worked, why not)."""
        began = time.monotonic()
        ok, output = await self._agent.call(["runs", "--json", "--address", address], self.settings.command_timeout)
        if ok:
            try:
                skipped = self.answers.store(address, output, time.time())
            except ValueError as error:
                ok, output = False, f"nbtrain runs --json answered something unexpected: {error}"
            else:
                if skipped:
                    self.log.warning("nbtrain: %s reports runs whose names are not run names; not shown: %s",
                                     address, ", ".join(map(repr, skipped)))
        self.log.debug("nbtrain: refreshed %s in %.1f s (%s)", address, time.monotonic() - began,
                       "ok" if ok else "failed")
        return ok, "" if ok else output[-_OUTPUT_CHARS:]

    # -- stops -----------------------------------------------------------------

    def request_stop(self, run: dict[str, Any]) -> dict[str, Any]:
        """Have the agent run ``nbtrain stop NAME --address ADDR`` unless that run is already stopping."""
        name = run["name"]
        current = self._stops.get(name)
        if current is None or current["status"] != "stopping":
            current = {"status": "stopping", "requested": time.time(), "message": None}
            self._stops[name] = current
            address = run.get("address") if isinstance(run.get("address"), str) else None
            self._spawn(self._stop(name, address or None, current))
        run["stop"] = dict(current)
        return run

    async def _stop(self, name: str, address: str | None, record: dict[str, Any]) -> None:
        began = time.monotonic()
        if address:
            ok, output = await self._agent.call(["stop", name, "--address", address], self.settings.command_timeout)
        else:  # without an address the tool would connect to $RAY_ADDRESS or start a local cluster
            ok, output = False, (f"The registry does not say which cluster runs {name!r}; "
                                 f"stop it from a notebook: nbtrain.attach({name!r}).stop()")
        if ok and address:
            self.log.info("nbtrain: stopped run %r in %.1f s", name, time.monotonic() - began)
            await self.refresh(address)  # the list shows it stopped without waiting for the next round
        else:
            record["status"] = "failed"
            record["message"] = output[-_OUTPUT_CHARS:] or "the stop command failed without a message"
            self.log.warning("nbtrain: stopping run %r failed: %s", name, record["message"])
        while len(self._stops) > self.settings.max_stop_history:
            self._stops.pop(next(iter(self._stops)))

    async def steer(self, run: dict[str, Any], verb: str) -> tuple[bool, str]:
        """``nbtrain pause|resume NAME --address A`` by the agent, then a fresh list: (done, what the tool said)."""
        ok, output = await self._agent.call([verb, run["name"], "--address", run["address"]],
                                            self.settings.command_timeout)
        if ok:
            await self.refresh(run["address"])
        return ok, output.strip().splitlines()[-1] if output.strip() else f"nbtrain {verb} failed without a message"

    def _annotate(self, run: dict[str, Any]) -> dict[str, Any]:
        """Attach what this server knows about a stop it was asked for."""
        record = self._stops.get(run["name"])
        if record is not None and run["terminal"] and record["status"] == "stopping":
            self._stops.pop(run["name"], None)  # the cluster says it ended: the stop is done
            record = None
        run["stop"] = dict(record) if record is not None else None
        return run

    # -- refreshing while a browser watches --------------------------------------

    def watched(self, runs: list[dict[str, Any]]) -> None:
        """A browser polled ``runs``: keep refreshing for ``watch_window``; refresh at once on its
        first poll and when it shows a live run on a cluster the agent has not been asked about."""
        first = time.monotonic() - self._last_watch > self.settings.watch_window
        new_clusters = _live_addresses(runs) - self._clusters_seen
        self._clusters_seen |= new_clusters
        self._last_watch = time.monotonic()
        if self.settings.refresh_interval <= 0:
            return
        if self._loop_task is None:
            # Started on the first poll, inside the running IOLoop.
            self._loop_task = asyncio.ensure_future(self._refresh_loop())
        if first:
            self._retry.clear()  # after a pause, try failing clusters again too
        if first or new_clusters:
            self._refresh_wanted.set()

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._refresh_wanted.wait(), timeout=self.settings.refresh_interval)
            except asyncio.TimeoutError:
                pass
            self._refresh_wanted.clear()
            try:
                for address in self._due_addresses():
                    ok, why = await self.refresh(address)
                    self._schedule(address, ok, why)
                await self._close_idle_agent()
            except Exception:  # keep refreshing whatever one attempt ran into
                self.log.exception("nbtrain: refresh crashed")

    def _due_addresses(self) -> list[str]:
        """While watched: the clusters of live runs and sweeps (a sweep between trials has no live
        run) and the last connected one (the sidebar's cluster line shows what it answers), less
        those backing off after a failure."""
        if time.monotonic() - self._last_watch > self.settings.watch_window:
            return []
        wanted = _live_addresses(self._served_runs()) | _live_addresses(self.sweeps())
        if (cluster := read_cluster(self.home)) is not None:
            wanted.add(cluster["address"])
        for address in set(self._retry) - wanted:
            del self._retry[address]
        now = time.monotonic()
        return sorted(address for address in wanted if self._retry.get(address, (0.0, now))[1] <= now)

    def _schedule(self, address: str, ok: bool, why: str) -> None:
        if ok:
            self._retry.pop(address, None)
            return
        # Unreachable, or nbtrain not installed there yet: ask that cluster less often.
        interval = self.settings.refresh_interval
        delay = min(max(self._retry.get(address, (0.0, 0.0))[0] * 2, interval), self.settings.refresh_max_backoff)
        self._retry[address] = (delay, time.monotonic() + delay)
        self.log.info("nbtrain: refreshing %s failed (next try in %.0f s): %s", address, delay, why)

    async def _close_idle_agent(self) -> None:
        unwatched = time.monotonic() - max(self._last_watch, self._agent.last_used)
        if self._agent.running and unwatched > self.settings.agent_idle_timeout:
            self.log.info("nbtrain: closing the idle agent")
            await self._agent.close()

    # -- plumbing ----------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _live_addresses(runs: list[dict[str, Any]]) -> set[str]:
    return {run["address"] for run in runs
            if not run["terminal"] and isinstance(run.get("address"), str) and run["address"]}
