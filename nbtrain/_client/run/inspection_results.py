"""What ``run.stacks()`` and ``run.profile()`` return: plain data that shows itself in a notebook (an HTML table)
and as text (``print``)."""

from __future__ import annotations

import html
import os
from typing import Any

from nbtrain._cluster.commands import where_rank_is

PERFETTO = "https://ui.perfetto.dev"


class Stacks:
    """Every asked rank's threads and where its training thread is.

    ``ranks``: rank → ``{"verdict", "kind", "pid", "threads"}`` for each rank that answered (``kind``:
    ``collective``, ``elsewhere``, ``paused`` or ``outside``; each thread: ``name``, ``whose`` — ``training``,
    ``user``, ``nbtrain`` or ``library`` — and ``frames`` as (file, line, function, source), outermost
    first); ``missing``: rank → why there is no answer.
    """

    def __init__(self, run: str, asked: list[int], answers: dict[int, tuple[bool, Any]], wait_s: float) -> None:
        self.run = run
        self.ranks: dict[int, dict[str, Any]] = {rank: answers[rank][1] for rank in asked
                                                 if rank in answers and answers[rank][0]}
        self.lines = {rank: where_rank_is(rank, answers.get(rank), wait_s) for rank in asked}
        self.missing = {rank: line for rank, line in self.lines.items() if rank not in self.ranks}

    def verdicts(self) -> dict[int, str]:
        """Each rank's one line: ``{0: "rank 0 waits in a collective (all_reduce) called from ..."}``."""
        return dict(self.lines)

    def __str__(self) -> str:
        out = [f"Stacks of run {self.run!r}:"] + [f"  {line}" for line in self.lines.values()]
        for rank, answer in self.ranks.items():
            out.append(f"\n--- rank {rank} (pid {answer.get('pid')}) ---")
            for thread in answer["threads"]:
                out.append(f'Thread "{thread["name"]}" ({thread["whose"]}):')
                out.append(_frames_text(thread))
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<Stacks of run {self.run!r}: " + "; ".join(self.lines.values()) + ">"

    def _repr_html_(self) -> str:
        return self.html()

    def html(self, compact: bool = False) -> str:
        """One line per rank, its training thread's stack open (``compact``: closed) and the others closed."""
        parts = [f"<div class='nbtrain-stacks'><b>Stacks of run {html.escape(self.run)}</b><ul>"]
        for rank, line in self.lines.items():
            colour = {"collective": "#1f77b4", "elsewhere": "#ff7f0e", "paused": "#2ca02c"}.get(
                self.ranks.get(rank, {}).get("kind", ""), "#d62728")
            parts.append(f"<li><span style='color:{colour}'>{html.escape(line)}</span>")
            for thread in self.ranks.get(rank, {}).get("threads", []):
                opened = " open" if thread["whose"] == "training" and not compact else ""
                frames = html.escape(_frames_text(thread))
                parts.append(f"<details{opened}><summary>{html.escape(thread['name'])} "
                             f"<small>({html.escape(thread['whose'])}, {len(thread['frames'])} frames)</small>"
                             f"</summary><pre style='font-size:11px'>{frames}</pre></details>")
            parts.append("</li>")
        return "".join(parts) + "</ul></div>"


def _frames_text(thread: dict[str, Any]) -> str:
    start = int(thread.get("from") or 0)
    hidden = start + int(thread.get("cut") or 0)
    lines = [f"  ... {hidden} outer frames (Ray's, nbtrain's)"] if hidden else []
    for filename, lineno, function, source in thread["frames"][start:]:
        lines.append(f'  File "{filename}", line {lineno}, in {function}')
        if source:
            lines.append(f"    {source.strip()}")
    return "\n".join(lines)


class Profile:
    """Top operators by self time per profiled rank, and where each rank's trace is.

    ``tables``: rank → rows (``name``, ``calls``, ``self_cpu_us``, ``self_cpu_pct``, ``cpu_total_us``; on a GPU
    also ``self_gpu_us``, ``self_gpu_pct``), most self time first; ``trace_paths``: rank → the gzipped Chrome
    trace on the cluster's head node (None if it was too big to keep); ``notes``: rank → what to know.
    """

    def __init__(self, run: str, steps: int, answers: dict[int, dict[str, Any]]) -> None:
        self.run = run
        self.steps = steps
        self.answers = answers
        self.tables = {rank: answer["table"] for rank, answer in answers.items()}
        self.trace_paths: dict[int, str | None] = {rank: answer.get("trace") for rank, answer in answers.items()}
        self.notes = {rank: answer["note"] for rank, answer in answers.items() if answer.get("note")}

    def how_to_open(self) -> str:
        """Where the traces are, and which tools open them."""
        paths = [path for path in self.trace_paths.values() if path]
        if not paths:
            return "No trace was kept."
        logdir = os.path.dirname(os.path.dirname(paths[0]))
        return (f"Open a trace at {PERFETTO} (or chrome://tracing), or all of them with TensorBoard's profiler "
                f"plugin: pip install torch-tb-profiler; tensorboard --logdir {logdir} (on the cluster's head node).")

    def _heading(self, rank: int) -> str:
        answer = self.answers[rank]
        step = f", {answer['step_ms']:.1f} ms per step with the profiler on" if answer.get("step_ms") else ""
        note = f" ({self.notes[rank]})" if rank in self.notes else ""
        return f"rank {rank}: {answer['steps']} steps on the {answer['device'].upper()}{step}{note}"

    def __str__(self) -> str:
        out = [f"Profile of run {self.run!r}, top operators by self time:"]
        for rank, rows in self.tables.items():
            out.append(self._heading(rank))
            gpu = any("self_gpu_us" in row for row in rows)
            out.append(f"  {'operator':<40} {'calls':>7} {'self CPU ms':>12} {'%':>6} {'CPU total ms':>13}"
                       + (f" {'self GPU ms':>12} {'%':>6}" if gpu else ""))
            for row in rows:
                out.append(f"  {row['name'][:40]:<40} {row['calls']:>7} {row['self_cpu_us'] / 1e3:>12.3f} "
                           f"{row['self_cpu_pct']:>6.1f} {row['cpu_total_us'] / 1e3:>13.3f}"
                           + (f" {row['self_gpu_us'] / 1e3:>12.3f} {row['self_gpu_pct']:>6.1f}" if gpu else ""))
            out.append(f"  trace: {self.trace_paths[rank] or 'not kept'}")
        out.append(self.how_to_open())
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<Profile of run {self.run!r}, {self.steps} steps, ranks {sorted(self.tables)}>"

    def _repr_html_(self) -> str:
        return self.html()

    def html(self, top: int | None = None) -> str:
        """A table per rank (its ``top`` operators; default all of them), its trace's path, and how to open it."""
        parts = [f"<div class='nbtrain-profile'><b>Profile of run {html.escape(self.run)}</b>: top operators by "
                 "self time"]
        cell = "style='text-align:right;padding:0 6px'"
        for rank, rows in self.tables.items():
            gpu = any("self_gpu_us" in row for row in rows)
            head = ["operator", "calls", "self CPU ms", "self CPU %", "CPU total ms"] + (
                ["self GPU ms", "self GPU %"] if gpu else [])
            parts.append(f"<div><b>{html.escape(self._heading(rank))}</b></div><table><tr>"
                         + "".join(f"<th {cell if index else ''}>{name}</th>" for index, name in enumerate(head))
                         + "</tr>")
            for row in rows[:top]:
                values = [str(row["calls"]), f"{row['self_cpu_us'] / 1e3:.3f}", f"{row['self_cpu_pct']:.1f}",
                          f"{row['cpu_total_us'] / 1e3:.3f}"]
                if gpu:
                    values += [f"{row['self_gpu_us'] / 1e3:.3f}", f"{row['self_gpu_pct']:.1f}"]
                parts.append(f"<tr><td><code>{html.escape(row['name'])}</code></td>"
                             + "".join(f"<td {cell}>{value}</td>" for value in values) + "</tr>")
            path = self.trace_paths[rank]
            parts.append(f"</table><div>trace: <code>{html.escape(path or 'not kept')}</code></div>")
        return "".join(parts) + f"<div><small>{html.escape(self.how_to_open())}</small></div></div>"
