"""How an attempt ended, what happens next, and how a failure is told to the user.

An attempt ends :class:`Succeeded`, :class:`Stopped`, :class:`Failed` (with
the ranks that failed) or, for an elastic run, a
:class:`~nbtrain._cluster.elastic.policy.Resize`. The controller asks its
:class:`FailurePolicy` after each failed attempt: a :class:`Restart` (from the
latest checkpoint, within ``max_failures``) or :class:`GiveUp`; and
:func:`format_error` writes the message the user reads: the failing ranks
first, with their tracebacks; ranks whose collective broke only because
another rank failed come after, as consequences.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from nbtrain._cluster.elastic.policy import Resize

# A rank whose collective broke because *another* rank failed says one of these.
_SECONDARY_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                      "NCCL communicator was aborted", "ProcessGroupGloo", "recvBytes", "sendBytes")
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 2.0


@dataclasses.dataclass
class Failure:
    """Why one attempt ended badly, in words a user can act on."""

    rank: int | None
    kind: str              # raised | died | stalled | nan | resources | startup | runtime_env
    summary: str
    traceback: str = ""
    retriable: bool = True
    secondary: bool = False
    node: str | None = None       # the worker table's name for the rank's node (died failures)
    node_id: str | None = None    # its Ray node id: lets an elastic run tell a lost node from a crash

    def as_dict(self, attempt: int, last_lines: list[str] | None = None) -> dict[str, Any]:
        """``last_lines``: what a rank whose process died printed last (its feed's log lines)."""
        return {"rank": self.rank, "kind": self.kind, "summary": self.summary,
                "traceback": self.traceback, "attempt": attempt, "secondary": self.secondary,
                "last_lines": list(last_lines or [])}


@dataclasses.dataclass(frozen=True)
class Succeeded:
    results: list[bytes]   # each rank's pickled return value, by rank


@dataclasses.dataclass(frozen=True)
class Stopped:
    pass


@dataclasses.dataclass(frozen=True)
class Failed:
    failures: list[Failure]

    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.failures if f.rank is not None and not f.secondary]

    @property
    def died_on(self) -> dict[str, str]:
        """The nodes of ranks whose process died (Ray node id → the worker table's name): maybe lost nodes."""
        return {f.node_id: f.node or f.node_id[:6] for f in self.failures if f.kind == "died" and f.node_id}


Outcome = Succeeded | Stopped | Failed | Resize


@dataclasses.dataclass(frozen=True)
class Restart:
    delay_s: float
    why: str


@dataclasses.dataclass(frozen=True)
class GiveUp:
    why: str


class FailurePolicy:
    """Restart while every failure is retriable and ``max_failures`` lasts; else give up.

    ``failed_attempts``: the failed attempts already counted against the budget (a supervisor that
    restarts takes up its run's; a user's resume starts afresh).
    """

    def __init__(self, max_failures: int, failed_attempts: int = 0) -> None:
        self.max_failures = max_failures
        self.failed_attempts = failed_attempts

    def decide(self, outcome: Failed) -> Restart | GiveUp:
        """Counts ``outcome`` against the budget and says what happens next."""
        self.failed_attempts += 1
        why = headline(outcome.failures)
        if all(f.retriable for f in outcome.failures) and self.failed_attempts <= self.max_failures:
            return Restart(min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * self.failed_attempts), why)
        return GiveUp(why)


def raised(rank: int, outcome: dict[str, Any]) -> Failure:
    """A rank whose training function raised (the worker's outcome dict)."""
    secondary = any(marker in outcome["message"] or marker in outcome["traceback"] for marker in _SECONDARY_MARKERS)
    return Failure(rank, "raised", f"Rank {rank} raised {outcome['type']} at step {outcome['step']}: "
                                   f"{outcome['message']}", outcome["traceback"], secondary=secondary)


def died(rank: int, pid: Any, node: str | None, node_id: str | None, exc: Exception) -> Failure:
    """A rank whose process died (killed, out of memory, node lost)."""
    return Failure(rank, "died", f"Rank {rank}'s worker process died (pid {pid} on {node}): {death_cause(exc)}",
                   node=node, node_id=node_id)


def death_cause(exc: Exception) -> str:
    """Why Ray says a worker process died, in one line: its exit detail when it gives one (the first line of
    an actor's death is always "The actor died unexpectedly...")."""
    text = str(exc)
    detail = re.search(r"Worker exit detail: (.+?)(?:\. |\.?$)", text, re.MULTILINE)
    if detail:
        return detail.group(1).strip()[:300]
    for line in text.splitlines():
        if "killed" in line.lower() or "exit" in line.lower() or "died" in line.lower() or "SIG" in line:
            return line.strip()[:300]
    return text.splitlines()[0][:300] if text else type(exc).__name__


def order(failures: list[Failure]) -> list[Failure]:
    """Causes first, consequences after; if every rank broke on the collective, all are causes."""
    primary = [f for f in failures if not f.secondary]
    if not primary:
        for failure in failures:
            failure.secondary = False
        return failures
    return primary + [f for f in failures if f.secondary]


def headline(failures: list[Failure]) -> str:
    primary = [f for f in failures if not f.secondary] or failures
    return "; ".join(f.summary for f in primary)


def format_error(failures: list[dict[str, Any]], world_size: int, max_failures: int, attempt: int,
                 failed_attempts: int) -> str:
    """The run's error text: the latest attempt's causes, the earlier attempts, the tracebacks."""
    latest = [f for f in failures if f["attempt"] == attempt]
    primary = [f for f in latest if not f["secondary"]] or latest
    others = world_size - len({f["rank"] for f in primary if f["rank"] is not None})
    lines = [f["summary"] for f in primary]
    if any(f["rank"] is not None for f in primary):
        lines.append(f"The other {others} worker{'s were' if others != 1 else ' was'} stopped; fix the code and re-run."
                     if others else "Fix the code and re-run.")
    if max_failures:
        lines.append(f"The run failed {failed_attempts} time(s), more than max_failures={max_failures}.")
        earlier = [f for f in failures if f["attempt"] != attempt and not f["secondary"]]
        lines.extend(f"  attempt {f['attempt']}: {f['summary']}" for f in earlier)
    for failure in primary:
        if failure["traceback"]:
            lines.append(f"\n--- rank {failure['rank']} traceback (attempt {failure['attempt']}) ---\n"
                         f"{failure['traceback'].rstrip()}")
        if failure.get("last_lines"):
            lines.append(f"\n--- rank {failure['rank']}'s last lines before its process died (attempt "
                         f"{failure['attempt']}) ---\n" + "\n".join(failure["last_lines"]))
    return "\n".join(lines)
