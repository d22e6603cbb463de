"""Metric rows regrouped for drawing, in memory that does not grow with the run.

Per metric and rank the most recent ``EXACT_POINTS`` points are kept exactly;
older points are folded into buckets that keep their first, minimum, maximum and
last point (with the steps where they occurred), so a spike at any step stays on
the curve. When a rank has more than ``MAX_BUCKETS`` buckets, adjacent ones are
merged and the bucket width doubles. Across ranks, a band per step keeps the
count, sum, minimum and maximum (:mod:`.band`). Everything is in
numpy arrays of bounded size, filled a batch at a time.

Rows arrive in order per rank almost always, so a batch is an append; a restart
that resumes from an earlier step (or a late batch) replaces the overlapping
tail, so the curve shows the attempt that counts. (A tail that reaches back into
the buckets is cut at the nearest kept point; the band forgets the steps from
where a new attempt resumes.) A rank going back within an attempt is a rewind
(``run.rewind()`` or a guard): the band's mean past that step is kept as the
branch the run went back from (:attr:`MetricHistory.superseded`, drawn faded),
the last ``KEPT_BRANCHES`` of them, before the band forgets it.
"""

from __future__ import annotations

import math
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from nbtrain._views.dashboard.band import RankBand
from nbtrain._views.dashboard.downsample import Array, downsample

RESERVED = frozenset({"rank", "step", "attempt", "time"})
EXACT_POINTS = 2000     # per metric and rank: the recent points, kept exactly
SPILL_POINTS = 500      # when the exact buffer is full, this many (or more) go to buckets at once
MAX_BUCKETS = 256       # per metric and rank: older points, in at most this many buckets
MAX_POINTS = 2000       # per drawn curve, unless the caller asks otherwise
KEPT_BRANCHES = 3       # per metric: the branches rewinds went back from, drawn faded

Ints = npt.NDArray[np.int64]
FX, FY, MINX, MINY, MAXX, MAXY, LX, LY = range(8)  # a bucket's fields


def _bucket_stats(x: Array, y: Array, width: int) -> Array:
    """Buckets of ``width`` consecutive points (the last may be shorter), one row of 8 fields each."""
    full = len(x) // width * width
    parts = [(x[:full].reshape(-1, width), y[:full].reshape(-1, width))] if full else []
    if full < len(x):
        parts.append((x[full:].reshape(1, -1), y[full:].reshape(1, -1)))
    out = []
    for xs, ys in parts:
        finite = np.isfinite(ys)
        rows = np.arange(len(xs))
        low = np.argmin(np.where(finite, ys, np.inf), axis=1)
        high = np.argmax(np.where(finite, ys, -np.inf), axis=1)
        out.append(np.stack([xs[:, 0], ys[:, 0], xs[rows, low], ys[rows, low], xs[rows, high], ys[rows, high],
                             xs[:, -1], ys[:, -1]], axis=1))
    return np.concatenate(out)


def _merge(a: Array, b: Array) -> Array:
    """Bucket rows ``a`` followed by bucket rows ``b`` (same shape) as one bucket each."""
    out = a.copy()
    out[:, LX], out[:, LY] = b[:, LX], b[:, LY]
    b_low = np.where(np.isfinite(b[:, MINY]), b[:, MINY], np.inf) < np.where(np.isfinite(a[:, MINY]), a[:, MINY],
                                                                               np.inf)
    b_high = np.where(np.isfinite(b[:, MAXY]), b[:, MAXY], -np.inf) > np.where(np.isfinite(a[:, MAXY]),
                                                                                a[:, MAXY], -np.inf)
    out[b_low, MINX], out[b_low, MINY] = b[b_low, MINX], b[b_low, MINY]
    out[b_high, MAXX], out[b_high, MAXY] = b[b_high, MAXX], b[b_high, MAXY]
    return out


def _from_points(x: Array, y: Array) -> Array:
    """One bucket row from a few sorted points."""
    row: Array = _bucket_stats(x, y, len(x))[0]
    return row


class _RankTiers:
    """One metric, every rank: exact recent points and older buckets, in 2-D arrays (rank by slot)."""

    def __init__(self) -> None:
        self.full = EXACT_POINTS + SPILL_POINTS
        self.x = np.empty((0, 0))
        self.y = np.empty((0, 0))
        self.n = np.zeros(0, dtype=np.int64)           # exact points held per rank
        self.last = np.zeros(0)                         # the last step held per rank (-inf: none)
        self.seen = np.zeros(0, dtype=bool)
        self.buckets = np.empty((0, MAX_BUCKETS, 8))
        self.nb = np.zeros(0, dtype=np.int64)          # buckets used per rank
        self.width = np.zeros(0, dtype=np.int64)       # points per full bucket
        self.open = np.zeros(0, dtype=np.int64)        # points in the last bucket (== width: full)

    # ------------------------------------------------------------------ storage
    def _grow_ranks(self, ranks: int) -> None:
        old = len(self.n)
        if ranks <= old:
            return
        size = max(ranks, 2 * old)
        more = size - old
        self.x = np.concatenate([self.x, np.empty((more, self.x.shape[1]))])
        self.y = np.concatenate([self.y, np.empty((more, self.y.shape[1]))])
        self.n = np.concatenate([self.n, np.zeros(more, dtype=np.int64)])
        self.last = np.concatenate([self.last, np.full(more, -np.inf)])
        self.seen = np.concatenate([self.seen, np.zeros(more, dtype=bool)])
        self.buckets = np.concatenate([self.buckets, np.empty((more, MAX_BUCKETS, 8))])
        self.nb = np.concatenate([self.nb, np.zeros(more, dtype=np.int64)])
        self.width = np.concatenate([self.width, np.ones(more, dtype=np.int64)])
        self.open = np.concatenate([self.open, np.zeros(more, dtype=np.int64)])

    def _grow_slots(self, needed: int) -> None:
        """Exact buffers start small and double up to ``EXACT_POINTS + SPILL_POINTS``."""
        slots = self.x.shape[1]
        if needed <= slots or slots >= self.full:
            return
        size = min(self.full, max(64, 1 << (needed - 1).bit_length()))
        pad = np.empty((len(self.n), size - slots))
        self.x = np.concatenate([self.x, pad], axis=1)
        self.y = np.concatenate([self.y, pad], axis=1)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.x, self.y, self.n, self.last, self.seen, self.buckets, self.nb,
                                      self.width, self.open))

    def stored_points(self) -> int:
        return int(self.n.sum() + 4 * self.nb.sum())

    def ranks(self) -> list[int]:
        return [int(r) for r in np.flatnonzero(self.seen)]

    # ------------------------------------------------------------------ ingest
    def add(self, ranks: Ints, steps: Array, values: Array) -> None:
        """Points in report order; per rank, steps usually increase past what is held."""
        order = np.argsort(ranks, kind="stable")
        r, s, v = ranks[order], steps[order], values[order]
        self._grow_ranks(int(r[-1]) + 1)
        self.seen[r] = True
        starts = np.concatenate([[0], np.flatnonzero(np.diff(r)) + 1])
        counts = np.diff(np.concatenate([starts, [len(r)]]))
        group = r[starts]
        previous = np.empty_like(s)
        previous[1:] = s[:-1]
        previous[starts] = self.last[group]
        backwards = np.add.reduceat((s <= previous).astype(np.int64), starts) > 0
        self._grow_slots(int((self.n[group] + counts).max()))
        fits = ~backwards & (self.n[group] + counts <= self.x.shape[1])
        take = np.repeat(fits, counts)
        if take.any():
            slot = np.arange(len(r)) - np.repeat(starts - self.n[group], counts)
            self.x[r[take], slot[take]] = s[take]
            self.y[r[take], slot[take]] = v[take]
            ends = starts + counts - 1
            self.n[group[fits]] += counts[fits]
            self.last[group[fits]] = s[ends[fits]]
        for index in np.flatnonzero(~fits):
            begin, end = starts[index], starts[index] + counts[index]
            self._add_rank(int(group[index]), s[begin:end], v[begin:end])

    def _add_rank(self, rank: int, s: Array, v: Array) -> None:
        breaks = np.flatnonzero(np.diff(s) <= 0) + 1
        for xs, ys in zip(np.split(s, breaks), np.split(v, breaks)):
            if xs[0] <= self.last[rank]:
                self._truncate(rank, float(xs[0]))
            self._extend(rank, xs, ys)

    def _extend(self, rank: int, s: Array, v: Array) -> None:
        n = int(self.n[rank])
        total = n + len(s)
        self._grow_slots(total)
        if total <= self.x.shape[1]:
            self.x[rank, n:total], self.y[rank, n:total] = s, v
        else:
            xs = np.concatenate([self.x[rank, :n], s])
            ys = np.concatenate([self.y[rank, :n], v])
            spill = total - EXACT_POINTS
            self._bucketize(rank, xs[:spill], ys[:spill])
            self.x[rank, :EXACT_POINTS], self.y[rank, :EXACT_POINTS] = xs[spill:], ys[spill:]
            total = EXACT_POINTS
        self.n[rank] = total
        self.last[rank] = s[-1]

    def _bucketize(self, rank: int, xs: Array, ys: Array) -> None:
        nb, width, filled = int(self.nb[rank]), int(self.width[rank]), int(self.open[rank])
        while nb + math.ceil(max(0, len(xs) - (width - filled if nb else 0)) / width) > MAX_BUCKETS:
            self._halve(rank)
            nb, width, filled = int(self.nb[rank]), int(self.width[rank]), int(self.open[rank])
        rows = self.buckets[rank]
        room = width - filled if nb else 0
        if room:
            head = _bucket_stats(xs[:room], ys[:room], room)
            rows[nb - 1] = _merge(rows[nb - 1:nb], head)[0]
            filled += min(room, len(xs))
            xs, ys = xs[room:], ys[room:]
        if len(xs):
            new = _bucket_stats(xs, ys, width)
            rows[nb:nb + len(new)] = new
            nb += len(new)
            filled = len(xs) - (len(new) - 1) * width
        self.nb[rank], self.open[rank] = nb, filled

    def _halve(self, rank: int) -> None:
        """Merge adjacent buckets in pairs: half as many, twice as wide."""
        rows, nb, width = self.buckets[rank], int(self.nb[rank]), int(self.width[rank])
        if not nb:
            self.width[rank] = 2 * width
            return
        pairs = nb // 2
        merged = _merge(rows[0:2 * pairs:2], rows[1:2 * pairs:2])
        last_count = int(self.open[rank]) + (width if nb % 2 == 0 else 0)
        if nb % 2:
            merged = np.concatenate([merged, rows[nb - 1:nb]])
        rows[:len(merged)] = merged
        self.nb[rank], self.width[rank], self.open[rank] = len(merged), 2 * width, last_count

    def _truncate(self, rank: int, step: float) -> None:
        """Forget what rank holds from ``step`` on (a restart resumed there)."""
        n = int(self.n[rank])
        cut = int(np.searchsorted(self.x[rank, :n], step, side="left"))
        self.n[rank] = cut
        if cut:
            self.last[rank] = self.x[rank, cut - 1]
            return
        rows = self.buckets[rank]
        nb = int(np.searchsorted(rows[:int(self.nb[rank]), FX], step, side="left"))
        self.nb[rank] = nb
        if not nb:
            self.open[rank], self.last[rank] = 0, -np.inf
            return
        xs, ys = rows[nb - 1, [FX, MINX, MAXX, LX]], rows[nb - 1, [FY, MINY, MAXY, LY]]
        order = np.argsort(xs, kind="stable")
        keep = xs[order] < step
        rows[nb - 1] = _from_points(xs[order][keep], ys[order][keep])
        self.open[rank] = self.width[rank]  # closed: its count is no longer known
        self.last[rank] = rows[nb - 1, LX]

    # ------------------------------------------------------------------ drawing
    def points(self, rank: int, max_points: int = MAX_POINTS) -> tuple[Array, Array]:
        """The rank's curve in at most ``max_points`` points: the recent half exact, older ones M4-reduced."""
        if rank >= len(self.n) or not self.seen[rank]:
            return np.empty(0), np.empty(0)
        n, nb = int(self.n[rank]), int(self.nb[rank])
        rows = self.buckets[rank, :nb]
        bx, by = rows[:, [FX, MINX, MAXX, LX]], rows[:, [FY, MINY, MAXY, LY]]
        order = np.argsort(bx, axis=1, kind="stable")
        bx, by = np.take_along_axis(bx, order, 1).ravel(), np.take_along_axis(by, order, 1).ravel()
        distinct = np.concatenate([[True], np.diff(bx) > 0]) if len(bx) else np.empty(0, dtype=bool)
        recent = min(n, max_points // 2)
        older_x = np.concatenate([bx[distinct], self.x[rank, :n - recent]])
        older_y = np.concatenate([by[distinct], self.y[rank, :n - recent]])
        older_x, older_y = downsample(older_x, older_y, max_points - recent)
        return (np.concatenate([older_x, self.x[rank, n - recent:n]]),
                np.concatenate([older_y, self.y[rank, n - recent:n]]))


class MetricHistory:
    """Per metric: each rank's curve (recent exact, older bucketed) and the band across ranks.

    >>> history = MetricHistory()
    >>> history.add([{"rank": r, "step": s, "loss": float(r)} for s in range(5) for r in (0, 1)])
    >>> history.mean("loss")[1].tolist()
    [0.5, 0.5, 0.5, 0.5, 0.5]
    """

    def __init__(self) -> None:
        self._tiers: dict[str, _RankTiers] = {}
        self._bands: dict[str, RankBand] = {}
        self._attempt = 0
        self.resumed_at: dict[int, int] = {}  # attempt -> the step it resumed from (where a curve mark goes)
        # metric -> the mean across ranks of each branch a rewind went back from, oldest first: (steps, means)
        self.superseded: dict[str, list[tuple[Array, Array]]] = {}
        self._last_step: dict[int, float] = {}  # rank -> its last step this attempt (a step back is a rewind)
        self._went_back: tuple[float, set[int]] = (math.nan, set())  # the last rewind's first step, ranks seen back
        self.rows_seen = 0
        self.latest: dict[str, float] = {}
        self.text: dict[int, dict[str, str]] = {}  # rank -> the last text (or true/false) of each metric

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Take a batch of metric rows (as ``run.reader.rows_since`` gives them), a column at a time."""
        self.rows_seen += len(rows)
        while rows:
            ranks = np.fromiter(map(itemgetter("rank"), rows), np.int64, len(rows))
            steps = np.fromiter(map(itemgetter("step"), rows), float, len(rows))
            attempts = np.fromiter((a or 1 for a in map(dict.get, rows, repeat("attempt"))), np.int64, len(rows))
            if attempts[0] > self._attempt:  # one attempt at a time: a batch may hold the end of one, the next's start
                self._new_attempt(int(attempts[0]), steps[attempts == attempts[0]])
            later = np.flatnonzero(attempts > self._attempt)
            end = int(later[0]) if len(later) else len(rows)  # rows up to the next attempt's first
            current = np.flatnonzero(attempts[:end] == self._attempt)
            back = _first_back_in(ranks[current], steps[current], self._last_step)
            stop = end if back is None else int(current[back])
            if stop:
                self._add_columns(rows[:stop], ranks[:stop], steps[:stop])
                taken = current[current < stop][::-1]  # each rank's last row first
                seen_ranks, last = np.unique(ranks[taken], return_index=True)
                self._last_step.update(zip(seen_ranks.tolist(), steps[taken][last].tolist()))
            if back is not None:
                self._rewound(int(ranks[stop]), float(steps[stop]))
            rows = rows[stop:]

    def _new_attempt(self, attempt: int, steps: Array) -> None:
        """Rows of a new attempt (a restart, a resize), at ``steps``: it resumes where they begin, and the band
        forgets from there."""
        if self._attempt:
            resumed = int(steps.min())
            self.resumed_at[attempt] = resumed
            for band in self._bands.values():
                band.forget_from(resumed)
        self._attempt = attempt
        self._last_step.clear()
        self._went_back = (math.nan, set())

    def _rewound(self, rank: int, step: float) -> None:
        """``rank`` went back to ``step`` in this attempt (a rewind): the first rank to do so keeps the band's branch
        from there as superseded and has the band forget it; the others, going back to that step, find it done."""
        at, ranks = self._went_back
        self._last_step[rank] = step - 1
        if at == step and rank not in ranks:
            ranks.add(rank)
            return
        for name, band in self._bands.items():
            xs, means, _low, _high = band.view()
            kept = xs >= step
            if kept.any():
                branches = self.superseded.setdefault(name, [])
                branches.append((xs[kept], means[kept]))
                del branches[:-KEPT_BRANCHES]
            band.forget_from(int(step))
        self._went_back = (step, {rank})

    def _add_columns(self, rows: list[dict[str, Any]], ranks: Ints, steps: Array) -> None:
        first = list(rows[0])  # in the order rows name them: the worker table shows text in that order
        names = first + sorted(set().union(*rows).difference(first))
        for name in names:
            if name not in RESERVED:
                self._add_column(name, list(map(dict.get, rows, repeat(name))), ranks, steps)

    def _add_column(self, name: str, values: list[Any], ranks: Ints, steps: Array) -> None:
        kinds = set(map(type, values))
        present: slice | npt.NDArray[np.bool_]
        if kinds <= {float, int}:
            numbers, present = np.array(values, dtype=float), slice(None)
        else:
            for rank, value in zip(ranks.tolist(), values):
                if isinstance(value, (str, bool)):  # not drawn as a curve: shown in the worker table
                    self.text.setdefault(rank, {})[name] = str(value)
            mask = np.fromiter((isinstance(v, (int, float)) and not isinstance(v, bool) for v in values), bool,
                               len(values))
            if not mask.any():
                return
            numbers, present = np.array([v for v, m in zip(values, mask) if m], dtype=float), mask
        rank_numbers, step_numbers = ranks[present], steps[present]
        self._tiers.setdefault(name, _RankTiers()).add(rank_numbers, step_numbers, numbers)
        self._bands.setdefault(name, RankBand()).add(step_numbers, numbers)
        self.latest[name] = float(numbers[-1])

    @property
    def metrics(self) -> list[str]:
        return sorted(self._tiers)

    def groups(self) -> dict[str, list[str]]:
        """Losses together, accuracies together, everything else on its own."""
        grouped: dict[str, list[str]] = {}
        for name in self.metrics:
            lowered = name.lower()
            if "loss" in lowered:
                grouped.setdefault("loss", []).append(name)
            elif "acc" in lowered:
                grouped.setdefault("accuracy", []).append(name)
            else:
                grouped.setdefault(name, []).append(name)
        return grouped

    def ranks(self, metric: str | None = None) -> list[int]:
        """The ranks that reported ``metric`` (any metric when None)."""
        if metric is None:
            return sorted({rank for tier in self._tiers.values() for rank in tier.ranks()})
        return self._tiers[metric].ranks() if metric in self._tiers else []

    def points(self, metric: str, rank: int, max_points: int = MAX_POINTS) -> tuple[Array, Array]:
        """One rank's curve for drawing: the recent half of ``max_points`` exact, older points M4-reduced."""
        tier = self._tiers.get(metric)
        return tier.points(rank, max_points) if tier else (np.empty(0), np.empty(0))

    def per_rank(self, metric: str, max_points: int = MAX_POINTS) -> dict[int, tuple[Array, Array]]:
        return {rank: self.points(metric, rank, max_points) for rank in self.ranks(metric)}

    def band(self, metric: str) -> tuple[Array, Array, Array, Array]:
        """(steps, mean, min, max) across ranks: per step for recent steps, per bin of steps before."""
        band = self._bands.get(metric)
        return band.view() if band else (np.empty(0), np.empty(0), np.empty(0), np.empty(0))

    def mean(self, metric: str) -> tuple[Array, Array]:
        steps, mean, _, _ = self.band(metric)
        return steps, mean

    def stored_points(self) -> int:
        """Points held for drawing, all metrics and ranks (bounded whatever the run's length)."""
        return sum(tier.stored_points() for tier in self._tiers.values())

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tiers.values()) + sum(b.nbytes for b in self._bands.values())


def _first_back_in(ranks: Ints, steps: Array, last: dict[int, float]) -> int | None:
    """The index of the first row whose step is not past its rank's previous one (in ``last``, then in the rows);
    None when every rank only goes on."""
    order = np.argsort(ranks, kind="stable")
    r, s = ranks[order], steps[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(r)) + 1])
    previous = np.empty_like(s)
    previous[1:] = s[:-1]
    previous[starts] = [last.get(int(rank), -math.inf) for rank in r[starts]]
    back = np.flatnonzero(s < previous)  # a step again is not back: rows of one step (loss, then val_loss)
    return int(order[back].min()) if len(back) else None


def take_new_rows(run: Any, history: MetricHistory) -> None:
    """Rows from where the history left off; rows the Run no longer holds are skipped, not waited for."""
    history.rows_seen = max(history.rows_seen, run.reader.row_window_start)
    history.add(run.reader.rows_since(history.rows_seen))
