"""A 256-rank run in the dashboard: a band instead of 256 lines, chosen ranks on demand, stragglers, pages.

The run is a stand-in object with the Run's read API (no cluster): the dashboard only reads
``_cached_rows`` / ``_cached_summary`` / ``_cached_log_entries`` / ``_cached_events``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nbtrain._views.dashboard.dashboard import (
    RANKS_PER_PAGE,
    TextProgress,
    WidgetDashboard,
    parse_ranks,
    stragglers,
)

pytestmark = pytest.mark.quick

NODES = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


class FakeRun:
    """As much of :class:`nbtrain.Run` as a dashboard reads: its name and its reader (``run.reader``), here itself."""

    def __init__(self, ranks: int, steps: int, lagging: dict[int, int] | None = None) -> None:
        self.name = "wide"
        self.reader = self
        lagging = lagging or {}
        self.rows = [{"rank": r, "step": s, "attempt": 1, "time": 0.0, "loss": float(r) + 1.0 / (s + 1)}
                     for s in range(steps) for r in range(ranks) if s < lagging.get(r, steps)]
        self.row_window_start = 0
        self.caught_up = True  # every row is in `rows`
        self.events: list[dict[str, Any]] = []
        workers = [{"rank": r, "node": NODES[r % len(NODES)], "hostname": f"host{r % len(NODES)}", "pid": 100 + r,
                    "device": "cpu", "state": "running", "step": lagging.get(r, steps) - 1, "steps_per_s": 10.0,
                    "rss_mb": 300.0} for r in range(ranks)]
        self.summary: dict[str, Any] = {"state": "running", "step": steps - 1, "world_size": ranks,
                                        "attempt": 1, "workers": workers}

    def refresh(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        return []

    def rows_since(self, start: int = 0) -> list[dict[str, Any]]:
        return self.rows[max(start - self.row_window_start, 0):]

    def logs_since(self, start: int = 0) -> list[dict[str, Any]]:
        return []


def trace_names(dashboard: WidgetDashboard) -> list[str]:
    return dashboard.widget.trace_names("loss")


def shown_ranks(dashboard: WidgetDashboard) -> list[int]:
    return [int(part.split('"')[0]) for part in dashboard.widget.workers["table"].split('<tr data-rank="')[1:]]


@pytest.fixture
def wide() -> WidgetDashboard:
    dashboard = WidgetDashboard(FakeRun(256, 50, lagging={17: 10, 200: 20}))
    dashboard.update()
    return dashboard


def test_a_wide_run_draws_the_mean_and_a_min_max_band_not_a_line_per_rank(wide):
    assert trace_names(wide) == ["loss min across ranks", "loss min–max across ranks", "loss mean"]
    (_, low), (_, high), (steps, mean) = (wide.widget.points("loss", name) for name in trace_names(wide))
    assert [trace.get("band") for trace in wide.widget.spec("loss")["traces"]] == ["low", "high", None]
    assert len(steps) == 50
    assert low[-1] == pytest.approx(0.02) and high[-1] == pytest.approx(255.02)
    assert mean[-1] == pytest.approx(np.mean([r + 0.02 for r in range(256) if r not in (17, 200)]))
    assert wide.widget.ranks["shown"]  # the "ranks:" box shows for wide runs


def test_chosen_ranks_get_lines_of_their_own_on_demand():
    dashboard = WidgetDashboard(FakeRun(256, 50), ranks=[0, 17])
    dashboard.update()
    assert trace_names(dashboard)[3:] == ["loss rank 0", "loss rank 17"]
    assert list(dashboard.widget.points("loss", "loss rank 17")[1][:2]) == [18.0, 17.5]

    dashboard.act({"action": "ranks", "value": "200-201, 5"})  # what the page sends when the box changes
    assert trace_names(dashboard)[3:] == ["loss rank 5", "loss rank 200", "loss rank 201"]
    assert trace_names(dashboard)[:2] == ["loss min across ranks", "loss min–max across ranks"]

    dashboard.act({"action": "ranks", "value": "abc"})
    assert dashboard.widget.ranks == {"shown": True, "value": "5, 200, 201",
                                      "error": "not a rank or range of ranks: 'abc' (write e.g. 0, 17, 200-203)"}
    assert dashboard.chosen_ranks == [5, 200, 201]


def test_rank_lists_are_read_like_a_person_writes_them():
    assert parse_ranks("0, 17, 200-203") == [0, 17, 200, 201, 202, 203]
    assert parse_ranks(" 3;1 ,, ") == [1, 3]
    with pytest.raises(ValueError, match="at most 16"):
        parse_ranks("0-255")
    with pytest.raises(ValueError, match="'9-2'"):
        parse_ranks("9-2")


def test_stragglers_are_listed_in_the_header_and_marked_in_the_table(wide):
    assert "stragglers: ranks 17, 200" in wide.widget.header
    wide.act({"action": "page", "by": 1})  # ranks 16-31
    assert shown_ranks(wide) == list(range(16, 32))
    assert '<tr data-rank="17" class="nbtrain-straggler"' in wide.widget.workers["table"]
    assert '<tr data-rank="18">' in wide.widget.workers["table"]
    assert '<td style="color:#ff7f0e">17</td>' in wide.widget.workers["summary"]  # node 10.0.0.2 holds rank 17


def test_stragglers_are_running_ranks_clearly_behind_the_median():
    def worker(rank: int, step: int, state: str = "running") -> dict[str, Any]:
        return {"rank": rank, "step": step, "state": state}

    assert stragglers([worker(0, 1000), worker(1, 995), worker(2, 1000)]) == []  # a few steps: noise
    assert stragglers([worker(0, 1000), worker(1, 900), worker(2, 1000)]) == [1]
    assert stragglers([worker(0, 1000), worker(1, 5, "finished"), worker(2, 1000)]) == []
    assert stragglers([worker(0, 20), worker(1, 5), worker(2, 20)]) == [1]
    assert stragglers([worker(0, 1000)]) == []


def test_the_worker_table_of_a_wide_run_pages_through_ranks_and_summarises_by_node_and_state(wide):
    assert shown_ranks(wide) == list(range(RANKS_PER_PAGE))
    assert wide.widget.workers["pager"] == {"page": 0, "pages": 16, "label": "ranks 0–15 of 256 (page 1/16)"}
    wide.act({"action": "page", "by": 1})  # the page's "next" button
    assert shown_ranks(wide) == list(range(16, 32))
    for _ in range(20):
        wide.act({"action": "page", "by": 1})
    assert shown_ranks(wide) == list(range(240, 256)) and wide.widget.workers["pager"]["page"] == 15
    wide.act({"action": "page", "by": -1})
    assert shown_ranks(wide) == list(range(224, 240))

    summary = wide.widget.workers["summary"]
    counts = [int(cell.split("<")[0]) for cell in summary.split('class="nbtrain-summary-count">')[1:]]
    assert counts == [64, 64, 64, 64] and summary.count("<tr data-node=") == 4
    assert '<tr data-node="10.0.0.1" data-state="running"><td>10.0.0.1</td><td>running</td>' in summary


def test_a_narrow_run_draws_a_line_per_rank_and_its_whole_table():
    dashboard = WidgetDashboard(FakeRun(2, 30))
    dashboard.update()
    assert trace_names(dashboard) == ["loss rank 0", "loss rank 1", "loss mean"]
    assert shown_ranks(dashboard) == [0, 1] and dashboard.widget.workers["summary"] == ""
    assert dashboard.widget.workers["pager"] is None and not dashboard.widget.ranks["shown"]


def test_a_run_that_turns_wide_drops_its_per_rank_lines():
    run = FakeRun(12, 20)
    run.summary["world_size"] = None  # not known yet: the ranks seen decide
    run.rows = [row for row in run.rows if row["rank"] < 2]
    dashboard = WidgetDashboard(run, ranks=[11])
    dashboard.update()
    assert trace_names(dashboard) == ["loss rank 0", "loss rank 1", "loss mean"]
    run.rows += [{"rank": r, "step": 20, "attempt": 1, "time": 0.0, "loss": 1.0} for r in range(12)]
    dashboard.update()
    assert trace_names(dashboard) == ["loss min across ranks", "loss min–max across ranks", "loss mean",
                                      "loss rank 11"]
    assert set(dashboard.widget._points["loss"]) == set(trace_names(dashboard)), "the views dropped the ranks' lines"


def test_rows_the_run_no_longer_holds_are_skipped_not_waited_for():
    run = FakeRun(1, 5000)
    run.row_window_start = 4000
    run.rows = run.rows[4000:]
    view = TextProgress(run, stream=open("/dev/null", "w"))  # noqa: SIM115 - closed with the test process
    view.update()
    assert view.history.rows_seen == 5000
    assert view.history.points("loss", 0)[0][0] == 4000


def test_outside_a_notebook_the_progress_line_names_the_stragglers():
    run = FakeRun(256, 50, lagging={17: 10, 200: 20})
    view = TextProgress(run)
    assert " 256 workers stragglers 17,200 " in view.line(run.summary)
    assert " 2 workers 0:00:00" in view.line(FakeRun(2, 5).summary)


def test_in_a_terminal_the_progress_is_one_line_rewritten_in_place():
    import os
    import select

    main, follower = os.openpty()  # a real terminal, as a terminal IPython's stdout is
    with os.fdopen(follower, "w") as terminal:
        run = FakeRun(2, 5)
        view = TextProgress(run, stream=terminal, interval=0.0)
        view.update()
        view.update()
        run.summary["state"] = "succeeded"
        view.update()
        shown = ""
        while "\n" not in shown and select.select([main], [], [], 5.0)[0]:  # a terminal hands it on in pieces
            shown += os.read(main, 65536).decode()
    os.close(main)
    lines = shown.replace("\r\n", "\n").split("\n")
    assert len(lines) == 2 and lines[1] == "", "one line, ended once the run has"
    assert lines[0].count("\r[nbtrain] wide ") == 3 and "succeeded" in lines[0].rsplit("\r", 1)[1]
