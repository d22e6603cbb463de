"""A run read from its files on the head node, for when no supervisor process holds it.

A finished run keeps no process: once it has ended and its history, result and
summary are on disk, its supervisor exits (see ``RunSupervisor``). Everything a
reader asks of a run after that — poll, summary, config, result, checkpoint,
delete — is answered by :class:`StoredRun` from those files, inside a
short-lived Ray task on the head node (``read_stored``): no process stays
behind, and the answers have the same shape as the supervisor's, so a
notebook following a run carries on across the supervisor's exit with the same
cursors.

Which runs exist is the run index, ``$NBTRAIN_HOME/run-index/<name>.json`` on
the head (one small file per run, naming its directory, which may be in a
``storage=`` path, and, when ``storage=`` is a pyarrow.fs URI, where the run's
checkpoints are there): the supervisor writes it when it takes up its storage,
``delete()`` removes it.

The same files are read without Ray on the head's own machine, where ``nbtrain
runs`` lists the embedded cluster's runs from them (:mod:`nbtrain._client.run_index`):
nothing here needs the run's cluster to be up.
"""

from __future__ import annotations

import math
import pickle
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from nbtrain._cluster.names import NAMESPACE, actor_name
from nbtrain._cluster.storage import post_mortems, storage_uri
from nbtrain._cluster.storage.history_log import HistoryLog, last_written
from nbtrain._cluster.storage.history_rules import branches_of_commands, left_out
from nbtrain._cluster.storage.run_storage import SPEC_FILE, RunStorage, checkpoint_for_fork
from nbtrain._cluster.supervisor.feed import RESERVED_KEYS, RunFeed
from nbtrain._exceptions import StorageError
from nbtrain._paths import read_json, run_index_dir, storage_root, write_atomic, write_json_atomic
from nbtrain._states import TERMINAL_STATE_NAMES, RunState

SUMMARY_FILE = "summary.json"  # the supervisor's last summary (workers as last seen, latest values)
RESULT_FILE = "result.pkl"     # what each rank returned: a pickled list of cloudpickle bytes
CONFIG_FILE = "config.pkl"     # the run's whole config, cloudpickled (it may hold any picklable value)
STATE_FILE = "state.json"      # written at every change of the run's state (RunStorage.save_state)
TAIL_ROWS = 1024               # the metric rows read for a run's last step and values when it has no final summary


def index_path(name: str, home: Path | None = None) -> Path:
    return run_index_dir(home) / f"{name}.json"


def record_in_index(name: str, directory: Path, launch_id: str, remote: str | None = None) -> None:
    """``remote``: the run's own directory at a ``storage=`` URI (``<uri>/<run>``, its checkpoints), if any."""
    entry = {"name": name, "dir": str(directory), "launch": launch_id}
    write_json_atomic(index_path(name), {**entry, "remote": remote} if remote else entry)


def delete_files(name: str, directory: Path) -> None:
    """Delete a run's files: its checkpoints at a ``storage=`` URI, its directory, then its index entry.

    Raises a :class:`StorageError` saying what to delete by hand; the entry stays until
    everything is gone, so ``delete()`` can be tried again.
    """
    entry = read_json(index_path(name))
    remote = entry.get("remote") if isinstance(entry, dict) else None
    if isinstance(remote, str):
        try:
            storage_uri.delete(remote)
        except StorageError as exc:
            msg = (f"Run {name!r}'s checkpoints could not all be deleted; delete {storage_uri.shown(remote)} "
                   f"by hand. {exc}")
            raise StorageError(msg) from None
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        msg = f"Run {name!r}'s files in {directory} could not all be deleted ({exc}); delete that directory by hand."
        raise StorageError(msg) from None
    index_path(name).unlink(missing_ok=True)


def indexed_directory(name: str, home: Path | None = None) -> Path | None:
    entry = read_json(index_path(name, home))
    if not isinstance(entry, dict) or not isinstance(entry.get("dir"), str):
        return None
    return Path(entry["dir"])


def indexed_names(home: Path | None = None) -> list[str]:
    try:
        return sorted(path.stem for path in run_index_dir(home).glob("*.json"))
    except OSError:
        return []


def write_final(directory: Path, summary: dict[str, Any], results: list[bytes] | None, config: bytes) -> None:
    """What a reader needs once the supervisor is gone, written before it exits (each file atomically)."""
    write_atomic(directory / CONFIG_FILE, config, durable=True)
    if results is not None:
        write_atomic(directory / RESULT_FILE, pickle.dumps(results), durable=True)
    write_json_atomic(directory / SUMMARY_FILE, summary, durable=True)


def step_reached(rows: list[dict[str, Any]], commands: list[dict[str, Any]]) -> int | None:
    """The step a run's rows say it reached: each rank's last row that counts, the furthest of them (a rank that
    reports less often does not hold it back). Which rows count is the history model's rule
    (:mod:`nbtrain._cluster.storage.history_rules`, fed the run's recorded ``commands``): not a row a rewind in place
    superseded, nor one a later attempt replaced. A rank's last row is its newest, so a rewind still under way
    (its ranks' going back not recorded yet) shows where the ranks report now. None before the first row."""
    counted = [row for row in rows if isinstance(row.get("step"), int) and isinstance(row.get("rank"), int)]
    if not counted:
        return None
    ranks = np.array([row["rank"] for row in counted])
    steps = np.array([row["step"] for row in counted])
    attempts = np.array([row.get("attempt") if isinstance(row.get("attempt"), int) else 1 for row in counted])
    times = np.array([float(row.get("time", math.inf)) for row in counted])
    left = left_out(branches_of_commands(commands), ranks, steps, attempts, times)
    last: dict[int, int] = {}
    for rank, step, gone in zip(ranks.tolist(), steps.tolist(), left.tolist()):
        if not gone:
            last[rank] = step
    return max(last.values(), default=None)


class StoredRun:
    """One run's files, answering as its supervisor would (reading methods, and ``delete``)."""

    def __init__(self, name: str, home: Path | None = None) -> None:
        directory = indexed_directory(name, home)
        try:
            written = (directory / STATE_FILE).stat().st_mtime if directory is not None else None
        except OSError:
            written = None
        if directory is None or written is None:
            msg = f"Run {name!r} has no stored files on this cluster's head node."
            raise FileNotFoundError(msg)
        self.name = name
        self.dir = directory
        self.state_written = written  # a live supervisor has written it since it took the run up
        self._state: dict[str, Any] = read_json(directory / STATE_FILE) or {}

    @property
    def ended(self) -> bool:
        """Whether the run ended as recorded (else its supervisor is alive, or vanished mid-run)."""
        return str(self._state.get("state")) in TERMINAL_STATE_NAMES

    def summary(self, live: bool = False, now: float | None = None) -> dict[str, Any]:
        """The run summed up as its supervisor would, from its files, as of ``now`` (default: the time of
        the call, as a cluster answers; a reader of the files alone passes :meth:`written`).

        A run that did not end was lost with its cluster (failed), unless ``live``: the caller knows
        its supervisor still holds it (its cluster is up and started before the run last wrote its
        state). A run without a final summary of this attempt shows the step and values its metric
        history recorded last.
        """
        saved = read_json(self.dir / SUMMARY_FILE)
        summary: dict[str, Any] = saved if isinstance(saved, dict) else {"name": self.name, "workers": []}
        # state.json is written at every state change; the summary only at the end
        state = self._state
        summary.update({key: state.get(key) for key in ("attempt", "failures", "error", "checkpoint", "started",
                                                         "ended") if key in state})
        summary["state"] = state.get("state", RunState.FAILED.value)
        summary["launch"] = state.get("launch")
        summary["stored"] = True
        summary["now"] = time.time() if now is None else now
        if not self.ended or "step" not in summary:  # a summary.json is an earlier attempt's end, if any
            summary.update(self.recorded())
        if not live and not RunState(summary["state"]).is_terminal:  # its supervisor vanished while it went on
            summary["error"] = (f"Run {self.name!r} was lost with its cluster: its supervisor is gone while the run "
                                f"was {summary['state']} (the cluster stopped or restarted). Its history and "
                                f"checkpoints are kept: continue it from its latest checkpoint with resume=True, or "
                                f"delete it.")
            summary["state"] = RunState.FAILED.value
            summary["ended"] = summary.get("ended") or summary["now"]
        return summary

    def written(self) -> float:
        """When the run's files last changed: its state, or its metric history."""
        history = last_written(self.dir, "metrics")
        return max(self.state_written, history[2] if history is not None else 0.0)

    def recorded(self) -> dict[str, Any]:
        """``{"step", "latest"}`` as the metric history has them last: :func:`step_reached` and each metric's
        last value (the step is ``None`` before the first row). Cached until the history or the state (its
        rewinds' records) is written again."""
        written = last_written(self.dir, "metrics")
        stamp = (*written, self.state_written) if written is not None else None
        cached = _recorded_cache.get(self.dir)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return dict(cached[1])
        log = HistoryLog(self.dir, "metrics", read_only=True)
        try:
            rows = log.read(max(0, len(log) - TAIL_ROWS))
        finally:
            log.close()
        latest: dict[str, Any] = {}
        for row in rows:
            latest.update((key, value) for key, value in row.items() if key not in RESERVED_KEYS)
        found = {"step": step_reached(rows, self._state.get("commands") or []), "latest": latest}
        if stamp is not None:
            while len(_recorded_cache) >= _CACHED_RUNS:
                _recorded_cache.pop(next(iter(_recorded_cache)))
            _recorded_cache[self.dir] = (stamp, found)
        return dict(found)

    def poll(self, cursor: int = 0, log_cursor: int = 0, event_cursor: int = 0, max_rows: int = 50_000,
             wait_s: float = 0.0) -> dict[str, Any]:
        """The supervisor's ``poll``; nothing new will arrive, so ``wait_s`` is not waited."""
        del wait_s
        feed = self._feed()
        answer = feed.read((cursor, log_cursor, event_cursor), max_rows, 0.0, lambda: True, list, 1.0)
        return {**answer, **self.summary()}

    def frame_ipc(self, start: int = 0, stop: int | None = None) -> bytes:
        return self._feed().frame_ipc(start, stop)

    def config(self) -> bytes | None:
        try:
            return (self.dir / CONFIG_FILE).read_bytes()
        except FileNotFoundError:
            return None

    def result(self) -> list[bytes] | None:
        try:
            data = (self.dir / RESULT_FILE).read_bytes()
        except FileNotFoundError:
            return None
        results: list[bytes] = pickle.loads(data)
        return results

    def latest_checkpoint(self) -> tuple[dict[str, Any], bytes | None, str | None] | None:
        checkpoint = self._state.get("checkpoint")
        if not checkpoint:
            return None
        path = str(checkpoint["path"])
        if self.dir.parent != storage_root() or storage_uri.is_remote(path):  # in storage=: the reader reads it
            return checkpoint, None, path
        with open(path, "rb") as handle:
            return checkpoint, handle.read(), None

    def fork_source(self, step: int | None) -> tuple[bytes | None, tuple[dict[str, Any], bytes] | str]:
        """``run.fork()`` of an ended run: its launch's spec (``None`` if an older nbtrain kept none) and checkpoint."""
        spec = self.dir / SPEC_FILE
        return (spec.read_bytes() if spec.exists() else None), checkpoint_for_fork(self._state.get("checkpoint"), step)

    def post_mortem(self, attempt: int, rank: int) -> bytes | None:
        """A failing rank's post-mortem (``%ray_debug``), as the supervisor kept it."""
        return post_mortems.read(self.dir, attempt, rank)

    def stop(self, timeout: float = 20.0) -> str:
        """Nothing to stop: a stored run has ended."""
        del timeout
        return str(self.summary()["state"])

    def steer(self, kind: str, args: dict[str, Any], definition: bytes | None = None) -> tuple[bool, str]:
        """Nothing to steer: a stored run has ended (the notebook raises this as the refusal)."""
        del kind, args, definition
        return False, f"it has ended ({self.summary()['state']}); only a live run can be steered."

    def delete(self) -> str:
        delete_files(self.name, self.dir)
        return "deleted"

    def _feed(self) -> RunFeed:
        feed = RunFeed(RunStorage.open_existing(self.dir), threading.RLock())
        feed.replay()
        return feed


# A long reader (the lab server) reads a finished run's history tail once, not on every listing.
_CACHED_RUNS = 256
_recorded_cache: dict[Path, tuple[tuple[str, int, float, float], dict[str, Any]]] = {}


def read_stored(name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The body of the reader task: one call of a :class:`StoredRun` method."""
    return getattr(StoredRun(name), method)(*args, **kwargs)


def stored_summaries(exclude: list[str]) -> list[dict[str, Any]]:
    """The summary of every indexed run not in ``exclude`` (the runs that still have a supervisor)."""
    found = []
    for name in indexed_names():
        if name in exclude:
            continue
        try:
            stored = StoredRun(name)
            if not stored.ended and _has_supervisor(name):
                continue  # launched after the caller listed the supervisors: it is listed next time
            found.append(stored.summary())
        except (OSError, ValueError):
            continue  # deleted meanwhile, or a half-written index entry
    return found


def _has_supervisor(name: str) -> bool:
    import ray

    try:
        ray.get_actor(actor_name(name), namespace=NAMESPACE)
    except ValueError:
        return False
    return True
