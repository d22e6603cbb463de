"""The dashboard's worker table as HTML: one row per rank, or for a wide run a summary by node and
state and pages of ranks; stragglers marked; and the ranks a user picks for lines of their own."""

from __future__ import annotations

import html
import re
from typing import Any

import numpy as np

TEXT_METRIC_CHARS = 60
RANKS_PER_PAGE = 16
MAX_CHOSEN_RANKS = 16        # per-rank lines drawn on demand in a wide run
STRAGGLER_MIN_LAG = 10       # steps behind the median step of the running ranks...
STRAGGLER_LAG_SHARE = 0.05   # ...and this share of the median step, whichever is more
HEADER = ("<thead><tr><th>rank</th><th>node</th><th>pid</th><th>device</th><th>state</th><th>step</th>"
          "<th>speed</th><th title=\"milliseconds per step: waiting for data / computing / waiting for the gradient "
          "all-reduce\">ms/step data · compute · comm</th><th>CPU</th><th>memory</th><th>heartbeat</th>"
          "<th>text metrics</th></tr></thead>")


def throughput(worker: dict[str, Any]) -> str:
    """samples/s when the rank knows its batch size, else steps/s, labelled; a dash before the first."""
    samples, steps = worker.get("samples_per_s"), worker.get("steps_per_s")
    if samples is not None:
        return f"{samples:.0f} samples/s"
    if steps is not None:
        return f"{steps:.3g} steps/s"
    return "–"


def stragglers(workers: list[dict[str, Any]]) -> list[int]:
    """Running ranks the run's supervisor flags (their own step time stays well above the median; see
    ``_cluster/supervisor/stragglers``), and those whose step lags the running ranks' median step by more than
    ``STRAGGLER_MIN_LAG`` steps and ``STRAGGLER_LAG_SHARE`` of the median."""
    running = [w for w in workers if w.get("state") == "running" and w.get("step") is not None]
    flagged = {int(w["rank"]) for w in running if w.get("straggler")}
    if len(running) < 2:
        return sorted(flagged)
    median = float(np.median([w["step"] for w in running]))
    threshold = max(STRAGGLER_MIN_LAG, STRAGGLER_LAG_SHARE * median)
    return sorted(flagged | {int(w["rank"]) for w in running if median - w["step"] > threshold})


def step_split(worker: dict[str, Any]) -> str:
    """``data · compute · comm`` in ms per step (the rank's last timed second), a dash before the first."""
    if worker.get("step_ms") is None:
        return "–"
    return " · ".join(f"{worker.get(key) or 0:.0f}" for key in ("data_ms", "compute_ms", "comm_ms"))


def parse_ranks(text: str) -> list[int]:
    """``"0, 17, 200-203"`` -> ``[0, 17, 200, 201, 202, 203]``; ValueError says which part is wrong."""
    ranks: set[int] = set()
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match or (match[2] and int(match[2]) < int(match[1])):
            msg = f"not a rank or range of ranks: {part!r} (write e.g. 0, 17, 200-203)"
            raise ValueError(msg)
        ranks.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    if len(ranks) > MAX_CHOSEN_RANKS:
        msg = f"{len(ranks)} ranks chosen; at most {MAX_CHOSEN_RANKS} are drawn as lines of their own"
        raise ValueError(msg)
    return sorted(ranks)


def worker_table(shown: list[dict[str, Any]], late: set[int], text: dict[int, dict[str, str]]) -> str:
    """The table of the ``shown`` workers; ``late``: stragglers; ``text``: each rank's last text metrics."""
    return ('<table class="nbtrain-workers" style="border-collapse:collapse;font-size:0.9em">' + HEADER + "<tbody>"
            + "".join(worker_row(worker, worker["rank"] in late, text.get(worker["rank"], {})) for worker in shown)
            + "</tbody></table>")


def worker_row(worker: dict[str, Any], late: bool, text: dict[str, str]) -> str:
    state = worker.get("state", "")
    age = worker.get("heartbeat_age_s")
    if state in ("running", "starting") and age is not None and age > 10:
        state = f"no heartbeat {age:.0f}s"
    colour = {"failed": "#d62728", "dead": "#d62728", "stalled": "#ff7f0e", "paused": "#9467bd",
              "finished": "#2ca02c"}.get(worker.get("state", ""), "inherit")
    if state.startswith("no heartbeat"):
        colour = "#ff7f0e"
    memory = f"{worker['rss_mb']:.0f} MB" if worker.get("rss_mb") else "–"
    if worker.get("gpu_mem_mb") is not None:
        memory += f" / GPU {worker['gpu_mem_mb']:.0f} MB"
    if worker.get("gpu_util") is not None:
        memory += f" ({worker['gpu_util']:.0f}% busy)"
    why = ("its own step time stays well above the median" if worker.get("straggler")
           else "behind the median step")
    mark = (f' class="nbtrain-straggler" style="background:#fff3e0" title="straggler: {why}"' if late else "")
    cpu = f"{worker['cpu_percent']:.0f}%" if worker.get("cpu_percent") is not None else "–"
    return (f'<tr data-rank="{worker["rank"]}"{mark}><td>{worker["rank"]}</td>'
            f'<td>{html.escape(str(worker.get("node")))}</td>'
            f'<td>{worker.get("pid")}</td><td>{html.escape(str(worker.get("device")))}</td>'
            f'<td style="color:{colour}" class="nbtrain-worker-state">{html.escape(state)}</td>'
            f'<td class="nbtrain-worker-step">{worker.get("step", 0)}</td>'
            f'<td class="nbtrain-worker-rate">{throughput(worker)}</td>'
            f'<td class="nbtrain-worker-split">{step_split(worker)}</td><td>{cpu}</td><td>{memory}</td>'
            f'<td>{"–" if age is None else f"{age:.1f}s ago"}</td>'
            f'<td class="nbtrain-worker-text">{text_metrics(text)}</td></tr>')


def summary_table(workers: list[dict[str, Any]], late: set[int]) -> str:
    """A wide run's workers by node and state: how many, their steps, and the stragglers among them."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for worker in workers:
        groups.setdefault((str(worker.get("node")), str(worker.get("state", ""))), []).append(worker)
    rows = []
    for (node, state), members in sorted(groups.items()):
        steps = np.array([m.get("step") or 0 for m in members])
        behind = sorted(m["rank"] for m in members if m["rank"] in late)
        rows.append(f'<tr data-node="{html.escape(node)}" data-state="{html.escape(state)}">'
                    f"<td>{html.escape(node)}</td><td>{html.escape(state)}</td>"
                    f'<td class="nbtrain-summary-count">{len(members)}</td><td>{steps.min()}</td>'
                    f"<td>{np.median(steps):g}</td><td>{steps.max()}</td>"
                    f'<td style="color:#ff7f0e">{", ".join(map(str, behind))}</td></tr>')
    return ('<table class="nbtrain-worker-summary" style="border-collapse:collapse;font-size:0.9em">'
            "<thead><tr><th>node</th><th>state</th><th>ranks</th><th>step min</th><th>median</th>"
            "<th>max</th><th>stragglers</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def text_metrics(values: dict[str, str]) -> str:
    """What the rank last reported as text (``report(phase="warmup")``), which no curve shows."""
    return html.escape(" · ".join(
        f"{key}={value if len(value) <= TEXT_METRIC_CHARS else value[:TEXT_METRIC_CHARS - 1] + '…'}"
        for key, value in values.items()))
