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
where a new attempt resumes.) Which rows a rewind (``run.rewind()`` or a guard)
superseded is the run history's rule (:mod:`nbtrain._cluster.storage.history_rules`), the one
``run.metrics_frame()`` and the head's reading of a run's files apply:
once a rank has gone back, what was drawn past the rewind's step becomes the
branch's own band (:meth:`MetricHistory.left_branches`, drawn faded; the last
``KEPT_BRANCHES``), and rows past that step of a rank that has not gone back yet
wait until it has. Metrics that only count (``epoch``) are not curves
(:attr:`MetricHistory.counters`). How far apart a metric's reports are (:mod:`.spacing`: a sparse metric is drawn
as points, a line breaks across a gap) is read from the points kept exactly and the edges of the buckets, which are
real consecutive reports: a thinned curve's widely spaced points are not a gap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from nbtrain._client.run.run_history import RESERVED, CountWatch
from nbtrain._cluster.storage.history_rules import Branch, branch_of_rows, branches_of
from nbtrain._states import RunState
from nbtrain._views.dashboard.band import RankBand
from nbtrain._views.dashboard.downsample import Array, downsample
from nbtrain._views.dashboard.spacing import breaks_between, is_sparse

EXACT_POINTS = 2000     # per metric and rank: the recent points, kept exactly
GAP_RANKS = 8           # the ranks a metric's usual gap between reports is read from
GAP_POINTS = 500        # and their latest points
SPILL_POINTS = 500      # when the exact buffer is full, this many (or more) go to buckets at once
MAX_BUCKETS = 256       # per metric and rank: older points, in at most this many buckets
MAX_POINTS = 2000       # per drawn curve, unless the caller asks otherwise
KEPT_BRANCHES = 3       # per metric: the branches rewinds went back from, drawn faded
HELD_ROWS = 100_000     # rows held for a rewind under way, at most (a rank that never goes back: drawn as they are)

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
    def usual_gap(self) -> float | None:
        """The median step between a rank's consecutive reports, read where they are kept exactly (None: too few)."""
        diffs = np.concatenate([np.diff(self.x[rank, max(0, self.n[rank] - GAP_POINTS):self.n[rank]])
                                for rank in self.ranks()[:GAP_RANKS]] or [np.empty(0)])
        diffs = diffs[diffs > 0]
        return float(np.median(diffs)) if len(diffs) else None

    def breaks(self, rank: int, usual: float) -> Array:
        """Where the rank's curve breaks: between consecutive reports known exactly, or the edges of two buckets,
        further apart than the rule allows."""
        if rank >= len(self.n) or not self.seen[rank]:
            return np.empty(0)
        exact, rows = self.x[rank, :self.n[rank]], self.buckets[rank, :self.nb[rank]]
        lefts, rights = [rows[:-1, LX], exact[:-1]], [rows[1:, FX], exact[1:]]
        if len(rows) and len(exact):
            lefts.append(rows[-1:, LX])
            rights.append(exact[:1])
        return breaks_between(np.concatenate(lefts), np.concatenate(rights), usual)

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
        self._branches: tuple[Branch, ...] = ()      # the run's rewinds, as the last batch came with them
        self._moved: set[int] = set()                # branches whose rows drawn before were moved to their bands
        self._branch_bands: dict[int, dict[str, RankBand]] = {}  # branch -> metric -> its rows' band (the last few)
        self._held: list[dict[str, Any]] = []        # rows a rewind under way may yet supersede, in report order
        self._counting: dict[str, CountWatch] = {}
        self._gaps: dict[str, float | None] = {}   # per metric, its usual gap as of the last batch (None: unknown)
        self.rows_seen = 0
        self.latest: dict[str, float] = {}
        self.text: dict[int, dict[str, str]] = {}  # rank -> the last text (or true/false) of each metric

    def add(self, rows: list[dict[str, Any]], branches: Sequence[Branch] = ()) -> None:
        """Take a batch of metric rows (as ``run.reader.rows_since`` gives them), a column at a time, with the
        run's rewinds as of them (:func:`~nbtrain._cluster.storage.history_rules.branches_of`): which rows a
        rewind superseded is the history rules' decision (:class:`~nbtrain._cluster.storage.history_rules.Branch`);
        rows it may yet supersede (a rank that has not gone back yet) wait here until it says."""
        self.rows_seen += len(rows)
        self._learn(tuple(branches))
        self._take(self._held + rows)

    def release(self) -> None:
        """The run has ended and every row is here: rows still waiting on a rewind that never came are drawn."""
        held, self._held = self._held, []
        self._take(held, final=True)

    def _take(self, rows: list[dict[str, Any]], final: bool = False) -> None:
        self._held = []
        self._gaps.clear()
        while rows:
            attempts = np.fromiter((a or 1 for a in map(dict.get, rows, repeat("attempt"))), np.int64, len(rows))
            if attempts[0] > self._attempt:  # one attempt at a time: a batch may hold the end of one, the next's start
                if self._held:  # the last attempt's rows that waited on a rewind: it never came for their ranks
                    held, self._held = self._held, []
                    self._decide(held, final=True)
                steps = np.fromiter(map(itemgetter("step"), rows), float, len(rows))
                self._new_attempt(int(attempts[0]), steps[attempts == attempts[0]])
            later = np.flatnonzero(attempts > self._attempt)
            end = int(later[0]) if len(later) else len(rows)  # rows up to the next attempt's first
            self._decide(rows[:end], final)
            rows = rows[end:]

    def _decide(self, rows: list[dict[str, Any]], final: bool) -> None:
        """Draw the rows the model has decided (current, or a branch's); keep those a rewind under way may take."""
        ranks = np.fromiter(map(itemgetter("rank"), rows), np.int64, len(rows))
        steps = np.fromiter(map(itemgetter("step"), rows), float, len(rows))
        times = np.fromiter((t if t is not None else math.inf for t in map(dict.get, rows, repeat("time"))), float,
                            len(rows))
        branch = branch_of_rows(self._branches, ranks, steps, times)
        waiting = np.zeros(len(rows), dtype=bool) if final else self._waiting(ranks, steps) & (branch < 0)
        if waiting.any():  # a rank's rows wait from its first that does: they stay in report order
            first = {int(rank): int(np.flatnonzero(waiting & (ranks == rank))[0]) for rank in np.unique(ranks[waiting])}
            waiting = np.fromiter((index >= first.get(int(rank), len(rows)) for index, rank in enumerate(ranks)),
                                  bool, len(rows))
            if len(self._held) + int(waiting.sum()) > HELD_ROWS:  # a rank never says: draw them as they are
                waiting[:] = False
        now = np.flatnonzero(~waiting & (branch < 0))
        if len(now):
            self._add_columns([rows[i] for i in now], ranks[now], steps[now])
        for number in np.unique(branch[branch >= 0]).tolist():
            left = np.flatnonzero(branch == number)
            self._add_to_branch(number, [rows[i] for i in left], steps[left])
        self._held.extend(rows[i] for i in np.flatnonzero(waiting))

    def _waiting(self, ranks: Ints, steps: Array) -> npt.NDArray[np.bool_]:
        """Rows past a rewind's step whose rank has not gone back yet, in this attempt."""
        waits = np.zeros(len(ranks), dtype=bool)
        for branch in self._branches:
            if branch.attempt not in (None, self._attempt):
                continue
            still = [rank for rank in np.unique(ranks).tolist() if branch.waits_for(rank)]
            waits |= (steps > branch.to_step) & np.isin(ranks, still)
        return waits

    def _learn(self, branches: tuple[Branch, ...]) -> None:
        """A rewind of this attempt that a rank has applied: what was drawn past its step was reported before
        (rows it may take wait meanwhile), so it is the branch's; the band and the ranks' curves forget it."""
        self._branches = branches
        for number, branch in enumerate(branches):
            if number in self._moved or branch.dropped or not branch.rank_times:
                continue
            if branch.attempt is not None and branch.attempt > self._attempt:
                continue  # a later attempt's (a history read whole): its rows are decided as they come
            self._moved.add(number)
            if branch.attempt not in (None, self._attempt):
                continue  # an earlier attempt's, learnt late: its rows past the resume step are forgotten already
            first_left = branch.to_step + 1
            self._branch_bands[number] = {name: band.copy() for name, band in self._bands.items()}
            for band in self._bands.values():
                band.forget_from(first_left)
            for tier in self._tiers.values():
                for rank in tier.ranks():
                    if tier.last[rank] >= first_left:
                        tier._truncate(rank, first_left)
            for old in sorted(self._branch_bands)[:-KEPT_BRANCHES]:
                del self._branch_bands[old]

    def _add_to_branch(self, number: int, rows: list[dict[str, Any]], steps: Array) -> None:
        """Rows a rewind superseded, reported after it was learnt (a slower rank's): into its branch's band."""
        if number in self._moved and number not in self._branch_bands:
            return  # an old branch, no longer drawn
        bands = self._branch_bands.setdefault(number, {})
        for name in set().union(*rows).difference(RESERVED):
            values = np.array([v if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
                               for v in map(dict.get, rows, repeat(name))], dtype=float)
            if np.isfinite(values).any():
                bands.setdefault(name, RankBand()).add(steps, values)
        for old in sorted(self._branch_bands)[:-KEPT_BRANCHES]:
            del self._branch_bands[old]

    def _new_attempt(self, attempt: int, steps: Array) -> None:
        """Rows of a new attempt (a restart, a resize), at ``steps``: it resumes where they begin, and the band
        forgets from there."""
        if self._attempt:
            resumed = int(steps.min())
            self.resumed_at[attempt] = resumed
            for band in self._bands.values():
                band.forget_from(resumed)
        self._attempt = attempt
        for watch in self._counting.values():
            watch.new_attempt()

    def left_branches(self, metric: str) -> list[tuple[Array, Array, Array]]:
        """The mean across ranks of each branch a rewind left (the last ``KEPT_BRANCHES``), oldest first, from the
        step after the one it went back to, as ``(steps, mean, breaks)``: drawn faded."""
        curves = []
        usual = self.usual_gap(metric)
        for number in sorted(self._branch_bands):
            band = self._branch_bands[number].get(metric)
            if band is None or number >= len(self._branches):
                continue
            xs, means, _low, _high = band.view()
            kept = xs > self._branches[number].to_step
            if kept.any():
                curves.append((xs[kept], means[kept], band.breaks(usual)))
        return curves

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
        self._counting.setdefault(name, CountWatch()).take(rank_numbers, numbers, kinds - {type(None)} == {int})
        self._tiers.setdefault(name, _RankTiers()).add(rank_numbers, step_numbers, numbers)
        self._bands.setdefault(name, RankBand()).add(step_numbers, numbers)
        self.latest[name] = float(numbers[-1])

    @property
    def metrics(self) -> list[str]:
        """The metrics drawn as curves: every number reported but those that only count (:attr:`counters`)."""
        return sorted(name for name in self._tiers if not self._counting[name].counts)

    @property
    def counters(self) -> dict[str, int]:
        """The metrics that only count (``epoch`` beside the loss), with their latest value: progress, not curves."""
        return {name: int(self.latest[name]) for name in sorted(self._tiers) if self._counting[name].counts}

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

    def _gap(self, metric: str) -> float | None:
        if metric not in self._gaps:
            tier = self._tiers.get(metric)
            self._gaps[metric] = tier.usual_gap() if tier else None
        return self._gaps[metric]

    def usual_gap(self, metric: str) -> float:
        """The usual step between a rank's consecutive reports of ``metric`` (1 when too few to tell)."""
        found = self._gap(metric)
        return 1.0 if found is None else found

    def sparse(self, metric: str) -> bool:
        """Whether ``metric`` is reported so much more rarely than the densest metric that it is drawn as points."""
        gaps = [gap for name in self._tiers if (gap := self._gap(name)) is not None]
        return is_sparse(self.usual_gap(metric), min(gaps, default=1.0))

    def rank_breaks(self, metric: str, rank: int) -> Array:
        """Where one rank's curve of ``metric`` breaks (:mod:`.spacing`)."""
        tier = self._tiers.get(metric)
        return tier.breaks(rank, self.usual_gap(metric)) if tier else np.empty(0)

    def band_breaks(self, metric: str) -> Array:
        """Where the mean (and the band) across ranks of ``metric`` breaks."""
        band = self._bands.get(metric)
        return band.breaks(self.usual_gap(metric)) if band else np.empty(0)

    def stored_points(self) -> int:
        """Points held for drawing, all metrics and ranks (bounded whatever the run's length)."""
        return sum(tier.stored_points() for tier in self._tiers.values())

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tiers.values()) + sum(b.nbytes for b in self._bands.values())


def take_new_rows(run: Any, history: MetricHistory) -> None:
    """Rows from where the history left off, with the run's rewinds as of them; rows the Run no longer holds are
    skipped, not waited for. Once the run has ended and every row is here, rows still waiting are drawn."""
    history.rows_seen = max(history.rows_seen, run.reader.row_window_start)
    summary = run.reader.summary
    history.add(run.reader.rows_since(history.rows_seen), branches_of(summary))
    if RunState(summary.get("state", RunState.PENDING)).is_terminal and run.reader.caught_up:
        history.release()
