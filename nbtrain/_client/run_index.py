"""``nbtrain runs`` without asking a cluster: the runs this home knows, from its files alone.

Asking a cluster means a Ray Client session: 5 s on an idle machine, half a
minute on a busy one, and with the embedded cluster down it would start one.
The files answer in milliseconds, up or down:

* the run registry (``runs/<name>.json``, :mod:`nbtrain._registry`): every run
  this home launched, its cluster and notebook, as it was at launch;
* on the machine of the embedded cluster's head (this one), the run index
  (``run-index/<name>.json``) and each run's storage
  (:class:`~nbtrain._cluster.supervisor.stored_run.StoredRun`): its state, written at
  every change; its metric history, appended as rows arrive (the step and
  values recorded last); its final summary once it ended.

A run whose files say it is going is "lost with its cluster" (failed, at the
last step it recorded) when that cluster's port does not answer, or when the
embedded cluster answering there started after the run last wrote its state
(a supervisor writes it when it takes the run up, so one of the running cluster
has written since it started). Only the cluster knows a live run's workers,
stragglers and pause, the warm workers and the sweeps: ``nbtrain runs --live``.

Each record's ``source`` says where its state and step come from:
``"files"`` or ``"launch record"`` (a run whose files are on another machine's
head: the state and step shown are those at launch).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from nbtrain._client.connecting import cluster_address
from nbtrain._client.local import local_cluster
from nbtrain._cluster.supervisor.stored_run import StoredRun, indexed_names
from nbtrain._exceptions import ConnectionFailedError
from nbtrain._net import port_is_open
from nbtrain._registry import (
    FILE_FIELDS,
    RunRecord,
    is_terminal,
    number,
    observe,
    read_cluster,
    read_runs,
    record_from_summary,
)

PROBE_TIMEOUT_S = 0.5  # a cluster's port that has not accepted a connection by then counts as down


@dataclass(frozen=True)
class ClusterSeen:
    """A cluster as this machine sees it without asking it anything."""

    address: str
    up: bool                       # its port (Ray Client's or the GCS's) accepts connections
    started: float | None = None   # when it started: this home's embedded cluster (running) only


def look(addresses: set[str]) -> dict[str, ClusterSeen]:
    """This home's embedded cluster (when it runs) and each of ``addresses``: whether its port answers,
    all probed at once, so the whole look takes at most :data:`PROBE_TIMEOUT_S`."""
    seen: dict[str, ClusterSeen] = {}
    local = local_cluster.status()
    if local is not None:
        seen.update((address, ClusterSeen(address, True, local.started)) for address in local.addresses)
    others = sorted(address for address in addresses if address and address not in seen)
    if others:
        with ThreadPoolExecutor(max_workers=min(16, len(others))) as pool:
            seen.update((address, ClusterSeen(address, up)) for address, up in zip(others, pool.map(_answers, others)))
    return seen


def _answers(address: str) -> bool:
    try:
        target = cluster_address.parse(address)
    except ConnectionFailedError:
        return False
    return port_is_open(target.host, target.port, timeout=PROBE_TIMEOUT_S)


def read_files(registry: list[RunRecord], home: Path | None = None
               ) -> tuple[dict[str, RunRecord], dict[str, ClusterSeen]]:
    """Each run of this home's run index as its files say (``source: "files"``), by name, and the clusters
    looked at: the embedded one, and those of runs whose files say they are going (none is probed when every
    run has ended). ``registry`` gives each run's cluster and what only launch() recorded (its total steps).

    A record's ``updated`` is when its files last changed; for a run lost with its cluster, now (the verdict is
    this look's); for a run going on, at least its registry record's (its files are this launch's, even when
    written just before launch() recorded it: only an ended run's files older than its record predate a resume).
    """
    by_name = {record["name"]: record for record in registry}
    stored = []
    for name in indexed_names(home):
        try:
            stored.append(StoredRun(name, home))
        except (OSError, ValueError):
            continue  # no state written yet (just launched), deleted meanwhile, or a half-written entry
    seen = look({by_name[run.name].get("address") or "" for run in stored if not run.ended and run.name in by_name})
    local = next((cluster for cluster in seen.values() if cluster.started is not None), None)
    files: dict[str, RunRecord] = {}
    for run in stored:
        launched = by_name.get(run.name)
        address = (launched.get("address") if launched else None) or (local.address if local is not None else "")
        cluster = seen.get(address)
        live = (not run.ended and cluster is not None and cluster.up
                and (cluster.started is None or run.state_written >= cluster.started))
        try:
            summary = run.summary(live=live, now=run.written())
        except (OSError, ValueError):
            continue  # its files went (deleted) while they were read
        if launched is not None:
            summary.setdefault("total_steps", launched["progress"]["total_steps"])  # a final summary has it
        record = record_from_summary(summary, address, source="files")
        if not run.ended and not live:
            record["updated"] = time.time()
        elif not run.ended and launched is not None:
            record["updated"] = max(record["updated"], number(launched.get("updated")))
        files[run.name] = record
    return files, seen


def with_files(registry: list[RunRecord], home: Path | None = None) -> tuple[list[RunRecord], dict[str, ClusterSeen]]:
    """The registry's records, each with what its files say (:data:`~nbtrain._registry.FILE_FIELDS`) when that is
    newer (:func:`~nbtrain._registry.observe`), then the runs only the run index has; live first, then newest
    first. Also the clusters looked at (:func:`read_files`).

    Example::

        runs, clusters = with_files(read_runs())
        [(run["name"], run["state"], run["progress"]["step"], run["source"]) for run in runs]
    """
    files, seen = read_files(registry, home)
    runs: list[RunRecord] = []
    for record in registry:
        listed: dict[str, Any] = {"source": "launch record", **record}
        if (said := files.pop(record["name"], None)) is not None:
            observe(listed, said, FILE_FIELDS)
        runs.append(cast(RunRecord, listed))
    runs.extend(files.values())
    runs.sort(key=lambda run: (is_terminal(run), -number(run.get("created"))))
    return runs, seen


def index_answer(home: Path | None = None) -> dict[str, Any]:
    """What ``nbtrain runs --json`` prints: ``nbtrain runs --live --json``'s shape (``address``, ``cluster``,
    ``runs``; no ``sweeps``: only the cluster has them), from this home's files, plus ``source: "files"`` and
    ``clusters``: whether the cluster of each listed run answers (``{address: {"up": bool}}``).

    ``address`` and ``cluster`` are the embedded cluster when it runs, else the cluster a notebook last
    connected to (``cluster.json``), with ``up``; ``null`` when there is neither.
    """
    runs, seen = with_files(read_runs(home), home)
    connected = read_cluster(home)
    wanted = {run.get("address") or "" for run in runs} | ({connected["address"]} if connected is not None else set())
    seen.update(look(wanted - set(seen)))
    local = next((cluster for cluster in seen.values() if cluster.started is not None), None)
    cluster: dict[str, Any] | None = None
    if local is not None:
        cluster = {"address": local.address, "kind": "local", "up": True}
    elif connected is not None:
        last = seen.get(connected["address"])
        cluster = {"address": connected["address"], "kind": connected.get("kind"), "up": bool(last and last.up)}
    if cluster is not None:
        cluster["updated"] = time.time()
    return {"address": cluster["address"] if cluster else None, "cluster": cluster, "runs": runs, "source": "files",
            "clusters": {address: {"up": found.up} for address, found in sorted(seen.items())}}
