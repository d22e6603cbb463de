"""The wall-clock ticks every rank of a run flushes on (its rows, logs and heartbeat to the supervisor)."""

from __future__ import annotations

import time


def until_next_tick(interval_s: float) -> float:
    """Seconds to the next multiple of ``interval_s`` on the wall clock.

    Every rank flushes on the same ticks, so the supervisor hears from all of them
    within a few milliseconds and one dashboard long poll carries every rank's
    rows: fewer wake-ups on cores the ranks need, and no rank's rows waiting a
    whole redraw behind another's.
    """
    left = interval_s - (time.time() % interval_s)
    # A wait that ended a hair before its tick (timeouts run on the monotonic clock, ticks on
    # the wall clock) has already served that tick: go on to the next, never flush twice.
    return left + interval_s if left < interval_s / 4 else left
