"""What the sidebar is served: the registry's records with their files' word, overlaid with the agent's answers.

Data comes one way. The registry (:mod:`nbtrain._registry`, written once per
launch and per connect) says which runs exist and where; the runs' own files on
this machine (:func:`nbtrain._client.run_index.read_files`: the embedded
cluster's run index and storage, read in milliseconds, cluster up or down) say
how each of its runs stands as of their last write; the agent's answers to
``nbtrain runs --json --address A`` say what cluster ``A`` reports now.
A served run takes its identity (name, address, notebook, created) from its
registry record and its state and progress from the newest word on it
(:func:`nbtrain._registry.observe`); ``source`` says whose. Runs an answer names
that the registry lacks (launched from another machine or home) are served too;
a name the registry already lists keeps the registry's run, so every name stays
one row and one URL.

Sweeps (with their trials) exist only on their cluster: they are served as the
newest answer from their cluster lists them (:func:`served_sweeps`); an answer
without ``sweeps`` (they could not be read) keeps the ones known before.

Answers live in memory, one per cluster address, replaced by the next answer
from the same cluster: a restarted server asks again. An answered run's
``updated`` is the server's clock when the answer came, so a cluster whose
clock is off never makes runs look fresher or staler than they are.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from nbtrain import _json
from nbtrain._lab.record_checks import (
    attach_cell,
    malformed_row,
    malformed_sweep,
    record_problem,
    sweep_problem,
    valid_name,
)
from nbtrain._registry import FILE_FIELDS, ClusterRecord, RunRecord, is_terminal, number, observe

OBSERVED_CLUSTER_FIELDS = ("nodes", "resources", "warm", "updated")


class ClusterAnswers:
    """The agent's latest answer for each cluster address."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[str, dict[str, Any]]] = {}  # address -> name -> RunRecord
        self._clusters: dict[str, dict[str, Any]] = {}          # address -> ClusterRecord
        self._sweeps: dict[str, list[dict[str, Any]]] = {}      # address -> its sweeps, as listed

    def store(self, address: str, output: str, received: float) -> list[str]:
        """Keep the answer ``output`` (the JSON ``nbtrain runs --json --address ADDRESS`` printed);
        returns the names it skipped (not run names: see :mod:`.record_checks`).

        Raises ``ValueError`` when it is not such an answer; what was kept before stays then.
        """
        answer = _json.loads(output)
        if not isinstance(answer, dict) or not isinstance(answer.get("runs"), list):
            msg = f"expected {{'address', 'cluster', 'runs'}} from nbtrain runs --json, got {output[:200]!r}"
            raise ValueError(msg)
        runs: dict[str, dict[str, Any]] = {}
        skipped = []
        for record in answer["runs"]:
            if isinstance(record, dict) and valid_name(record.get("name")):
                runs[record["name"]] = {**record, "address": address, "updated": received}
            else:
                skipped.append(str(record.get("name") if isinstance(record, dict) else record)[:120])
        self._runs[address] = runs
        cluster = answer.get("cluster")
        if isinstance(cluster, dict):
            self._clusters[address] = {**cluster, "address": address, "updated": received}
        sweeps = answer.get("sweeps")
        if isinstance(sweeps, list):
            self._sweeps[address] = [{**sweep, "address": address, "updated": received} if isinstance(sweep, dict)
                                     else {"name": str(sweep)[:120], "address": address} for sweep in sweeps]
        return skipped

    def answered(self, address: Any) -> bool:
        """Whether cluster ``address`` has answered since the server started."""
        return isinstance(address, str) and address in self._runs

    def run(self, address: Any, name: str) -> dict[str, Any] | None:
        return self._runs.get(address, {}).get(name) if isinstance(address, str) else None

    def runs(self) -> list[dict[str, Any]]:
        return [run for runs in self._runs.values() for run in runs.values()]

    def cluster(self, address: str) -> dict[str, Any] | None:
        return self._clusters.get(address)

    def sweeps(self) -> list[dict[str, Any]]:
        return [sweep for sweeps in self._sweeps.values() for sweep in sweeps]


# What a run record has only from its cluster's answers (the registry and the files know none of it): unknown.
ONLY_ITS_CLUSTER_SAYS: dict[str, Any] = {"paused_at": None, "parent": None, "rewinds": None,
                                         "patches": None}

def served_runs(registry: list[RunRecord], answers: ClusterAnswers, now: float,
                stale_after: float, current: str | None = None,
                files: dict[str, RunRecord] | None = None,
                embedded: Collection[str] = ()) -> list[dict[str, Any]]:
    """Every run to show, live first, then newest first, each with ``terminal``, ``stale``,
    ``malformed``, ``attach_cell`` and ``source``.

    ``files``: the runs of this machine's run index as their files say, by name
    (:func:`nbtrain._client.run_index.read_files`): their word on a run's state and progress
    (:data:`~nbtrain._registry.FILE_FIELDS`) is taken when it is newer than the agent's; what only the
    cluster knows (workers now, a pause, stragglers) stays the agent's.

    ``current``: the address of the cluster the home last connected to. A run recorded on another
    address that never answered, which the current cluster answers for from the home's storage
    (an embedded cluster stopped and started again, on a new port), is served as it answers: its
    final state, or failed and "lost with its cluster" when it was going as the cluster stopped.

    ``embedded``: this home's embedded cluster's addresses while it runs: a run there is opened with a plain
    ``%ray_connect``, which finds that cluster whatever its ports (they change when it starts again).

    ``stale``: a live run whose newest information is older than ``stale_after`` seconds
    (its cluster has not answered lately); the state shown is the last one known.
    ``malformed``: the record could not be shown (:mod:`.record_checks`); it is served as an
    ended run with an ``error`` saying why, and ``attach_cell`` ``None``.
    """
    served: list[dict[str, Any]] = []
    files = dict(files or {})
    for record in registry:
        run: dict[str, Any] = {**ONLY_ITS_CLUSTER_SAYS, "source": "launch record", **record}
        observed = answers.run(record.get("address"), record["name"])
        if observed is None and current is not None and not answers.answered(record.get("address")):
            observed = answers.run(current, record["name"])  # the same home's storage, a new cluster
            if observed is not None:
                run["address"] = current
        source = "its record in the run registry"
        if observed is not None and observe(run, observed):
            source = f"its record in the run registry with what {observed['address']} reports"
        if (said := files.pop(record["name"], None)) is not None and observe(run, said, FILE_FIELDS):
            source = "its record in the run registry with what its files say"
        served.append(_checked(run, source, embedded))
    listed = {run["name"] for run in served}
    for observed in answers.runs():
        if observed["name"] not in listed:
            listed.add(observed["name"])
            run = {"source": "cluster", **observed}
            if (said := files.pop(observed["name"], None)) is not None:
                observe(run, said, FILE_FIELDS)
            served.append(_checked(run, f"as {observed['address']} reports it", embedded))
    served.extend(_checked({**ONLY_ITS_CLUSTER_SAYS, **said}, "as its files on this machine say", embedded)
                  for name, said in files.items() if name not in listed)
    for run in served:
        run["terminal"] = run["malformed"] or is_terminal(run)
        age = now - number(run.get("updated") or run.get("created"))
        run["stale"] = not run["terminal"] and stale_after > 0 and age > stale_after
    served.sort(key=lambda run: (run["terminal"], -number(run.get("created"))))
    return served


def served_sweeps(answers: ClusterAnswers, now: float, stale_after: float) -> list[dict[str, Any]]:
    """Every sweep the clusters list, live first, then newest first, each with ``terminal``, ``stale``
    and ``malformed`` (then ``error`` says why and it has no trials: :func:`.record_checks.sweep_problem`).

    A trial is ``{"index", "state", "config", "iterations", "last", "best", "stop_reason", "error",
    "waiting_for", "run"}``; its run (``run``, a run name) is listed among the runs, where its
    "Open dashboard" is.
    """
    served = []
    for sweep in answers.sweeps():
        problem = sweep_problem(sweep)
        if problem is not None:
            served.append(malformed_sweep(sweep, problem, f"as {sweep.get('address')} lists it"))
            continue
        served.append({**sweep, "malformed": False, "trials": sorted(sweep["trials"], key=lambda t: t["index"])})
    for sweep in served:
        sweep["terminal"] = sweep["malformed"] or is_terminal(sweep)
        sweep["stale"] = not sweep["terminal"] and stale_after > 0 and now - number(sweep.get("updated")) > stale_after
    served.sort(key=lambda sweep: (sweep["terminal"], -number(sweep.get("started"))))
    return served


def _checked(run: dict[str, Any], source: str, embedded: Collection[str]) -> dict[str, Any]:
    problem = record_problem(run)
    if problem is not None:
        return malformed_row(run, problem, source)
    return {**run, "malformed": False, "attach_cell": attach_cell(run, embedded=run.get("address") in embedded)}


def served_cluster(record: ClusterRecord | None, answers: ClusterAnswers, now: float,
                   stale_after: float) -> dict[str, Any] | None:
    """The cluster a notebook last connected to, with what its latest answer says of it.

    Its identity (``address``, ``kind``) is the registry's; ``nodes`` and ``resources`` come
    only from the cluster's answers (unknown, ``None`` and ``{}``, until it answers), and
    ``stale`` says the newest answer is older than ``stale_after`` seconds (or none came).
    """
    if record is None:
        return None
    cluster: dict[str, Any] = {**record, "nodes": None, "resources": {}}
    observed = answers.cluster(record["address"])
    if observed is not None:
        cluster.update((key, observed[key]) for key in OBSERVED_CLUSTER_FIELDS if key in observed)
    cluster["stale"] = observed is None or (stale_after > 0 and now - number(observed.get("updated")) > stale_after)
    return cluster
