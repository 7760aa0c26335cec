"""The run page on a long journal: the window of steps the timeline and the tabs show, their totals,
the waterfall's rows, and a query count that does not grow with the journal."""

from __future__ import annotations

import json
import re
from datetime import UTC

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from runs import charts
from runs.window import AGGREGATE_ABOVE, RADIUS, Window, window_for
from tests.long_journal import seed_long_run

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 10_000


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"])
    return client


@pytest.fixture
def long_run(db):
    return seed_long_run(STEPS)


def gantt(body: str) -> dict:
    match = re.search(r'<script id="gantt-data" type="application/json">(.*?)</script>', body, re.S)
    assert match, "no timeline on the page"
    return json.loads(match.group(1))


def positions(fig: dict) -> list[int]:
    return sorted(p for trace in fig["data"] for p in trace["customdata"])


def test_the_window_is_radius_steps_around_the_current_one_and_slides_inward_at_either_end():
    assert window_for(10_000, 5_000) == Window(5_000 - RADIUS, 5_000 + RADIUS, 10_000)
    assert window_for(10_000, 3) == Window(1, 2 * RADIUS + 1, 10_000)
    assert window_for(10_000, 10_000) == Window(10_000 - 2 * RADIUS, 10_000, 10_000)
    assert window_for(7, 4) == Window(1, 7, 7) and window_for(7, 4).whole
    w = window_for(10_000, 1, lo=300, hi=200)  # a hand-made URL: clamped, never empty, never the whole journal
    assert (w.lo, w.hi) == (300, 300)
    assert window_for(10_000, 1, lo=1, hi=10_000).width == 1_000
    mid = window_for(10_000, 5_000)
    assert mid.earlier.hi == mid.lo - 1 and mid.later.lo == mid.hi + 1 and mid.last.hi == 10_000
    assert mid.first.lo == 1 and mid.first.width == mid.width


def test_the_page_opens_on_the_last_steps_of_a_long_run_with_totals_in_the_tabs(viewer, long_run):
    body = viewer.get(reverse("run_detail", args=[long_run])).content.decode()
    lo = STEPS - 2 * RADIUS
    assert f"Steps <strong>{lo:,}–{STEPS:,}</strong> of {STEPS:,}" in body
    assert positions(gantt(body))[0] == lo and positions(gantt(body))[-1] == STEPS
    assert f"Trace ({STEPS + STEPS // 10:,})" in body and f"Checkpoints ({STEPS // 5:,})" in body
    assert f"Events ({STEPS + 2:,})" in body
    assert "Showing the first" not in body  # the old cap is gone
    rows = [int(n) for n in re.findall(r'<tr data-seq="(\d+)"', body)]
    assert rows[0] == lo + 1 and rows[-1] == rows[0] + 99  # the events of those steps (seq = position + 1)
    assert 'id="window-later"' not in body and 'id="window-earlier"' in body


def test_a_deep_link_to_an_early_step_shows_the_window_around_it(viewer, long_run):
    body = viewer.get(reverse("run_detail", args=[long_run]), {"step": 40}).content.decode()
    assert f"Steps <strong>1–{2 * RADIUS + 1}</strong>" in body
    assert positions(gantt(body))[0] == 1
    assert [int(n) for n in re.findall(r'<tr data-seq="(\d+)"', body)][:2] == [1, 2]  # from run_started
    assert f'href="?step=40&amp;from={2 * RADIUS + 2}&amp;to={4 * RADIUS + 2}"' in body  # "Later"


def test_moving_the_window_answers_the_timeline_and_tabs_only(viewer, long_run):
    url = reverse("run_detail", args=[long_run])
    resp = viewer.get(url, {"step": 10, "from": 5_000, "to": 5_100, "fragment": "window"}, HTTP_HX_REQUEST="true")
    body = resp.content.decode()
    assert body.lstrip().startswith('<div id="run-window">') and "<html" not in body and 'id="journal"' not in body
    assert positions(gantt(body))[0] == 5_000 and positions(gantt(body))[-1] == 5_100
    trace = body[body.index('id="tab-trace"'):]
    assert "of steps 5,000–5,100, of 11,000 in the whole run" in trace and '<a href="?step=5000">' in trace
    checkpoints = body[body.index('id="tab-checkpoints"'):body.index('id="tab-effects"')]
    assert "21 of 2,000 checkpoint decisions: those of steps 5,000–5,100" in checkpoints
    assert "Events 5,001–5,101 of 10,002: those of steps 5,000–5,100" in body
    # Back after a swap (a history restore) gets the whole page, not a fragment
    restore = viewer.get(url, {"from": 5_000, "to": 5_100, "fragment": "window"}, HTTP_HX_REQUEST="true",
                         HTTP_HX_HISTORY_RESTORE_REQUEST="true").content.decode()
    assert "<html" in restore


def test_the_events_of_a_window_page_up_to_its_last_step(viewer, long_run):
    body = viewer.get(reverse("run_detail", args=[long_run]), {"from": 200, "to": 450}).content.decode()
    link = re.search(r'hx-get="(/runs/[^"]+/events/\?after=(\d+)&amp;until=(\d+))"', body)
    assert link and int(link.group(2)) == 300 and int(link.group(3)) == 451  # seq of step 450
    page = viewer.get(link.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true").content.decode()
    seqs = [int(n) for n in re.findall(r'<tr data-seq="(\d+)"', page)]
    assert seqs[0] == 301 and seqs[-1] == 400


def test_too_many_spans_in_the_window_aggregate_to_one_row_per_step_name(viewer, long_run):
    body = viewer.get(reverse("run_detail", args=[long_run]), {"from": 1, "to": 1_000}).content.decode()
    fig = gantt(body)
    labels = fig["layout"]["yaxis"]["categoryarray"]
    assert labels == ["fetch_doc ×1000", "model:scripted-small ×100"]
    assert "1,100 spans in these steps, too many to draw one by one" in body
    steps = next(t for t in fig["data"] if t["name"] == "step")
    assert steps["customdata"] == [1] and "10 failed" in steps["text"][0]  # every 97th step failed
    assert steps["marker"]["color"] == ["#d64545"]
    few = gantt(viewer.get(reverse("run_detail", args=[long_run]), {"from": 1, "to": 200}).content.decode())
    assert sum(len(t["y"]) for t in few["data"]) == 220 <= AGGREGATE_ABOVE  # one row per span


def test_odd_window_parameters_are_clamped_not_errors(viewer, long_run):
    url = reverse("run_detail", args=[long_run])
    for params in ({"from": "x"}, {"from": "-4", "to": "99999999999999999999"}, {"to": "0"},
                   {"from": "9999", "to": "3"}, {"from": "1e3"}, {"step": "7", "from": " 12 "}):
        assert viewer.get(url, params).status_code == 200, params
    body = viewer.get(url, {"from": 9_990, "to": 20_000}).content.decode()
    assert f"Steps <strong>9,990–{STEPS:,}</strong>" in body


def test_the_page_reads_the_same_number_of_queries_for_2k_and_10k_steps(viewer, long_run):
    short = seed_long_run(2_000)
    counts = {}
    for run_id in (short, long_run):
        url = reverse("run_detail", args=[run_id])
        for name, params, htmx in (("last", {}, False), ("first", {"step": 1}, False),
                                   ("middle", {"from": 900, "to": 1_000}, False),
                                   ("aggregated", {"from": 1, "to": 1_000}, False),
                                   ("fragment", {"from": 900, "to": 1_000, "fragment": "window"}, True)):
            extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
            with CaptureQueriesContext(connection) as ctx:
                assert viewer.get(url, params, **extra).status_code == 200
            counts.setdefault(name, []).append(len(ctx))
    assert all(a == b for a, b in counts.values()), counts
    assert max(max(v) for v in counts.values()) <= 40, counts


def test_a_short_run_shows_everything_and_says_so(viewer, drive):
    import journal

    run_id = journal.start("dash_many", 5)
    drive()
    body = viewer.get(reverse("run_detail", args=[run_id])).content.decode()
    assert "(the whole run)" in body and 'id="window-earlier"' not in body and 'id="trace-note"' not in body
    assert len(positions(gantt(body))) >= 5


def test_the_waterfall_lists_spans_in_time_order_with_every_label_and_a_step_to_click():
    from datetime import datetime, timedelta

    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    rows = [{"name": "b", "kind": "model", "position": 2, "attempt": 1, "status": "ok",
             "started_at": t0 + timedelta(seconds=2), "ended_at": None, "duration_ms": 5},
            {"name": "a", "kind": "step", "position": 1, "attempt": 1, "status": "ok", "started_at": t0,
             "ended_at": None, "duration_ms": 1500},
            {"name": "a", "kind": "step", "position": 1, "attempt": 2, "status": "error",
             "started_at": t0 + timedelta(seconds=1), "ended_at": None, "duration_ms": 10},
            {"name": "a", "kind": "step", "position": 1, "attempt": 2, "status": "ok",
             "started_at": t0 + timedelta(seconds=3), "ended_at": None, "duration_ms": 10}]
    fig = charts.waterfall(rows)
    labels = fig["layout"]["yaxis"]["categoryarray"]
    assert labels == ["1 a", "1 a (attempt 2)", "2 b", "1 a (attempt 2) [2]"]  # start order, each row its own
    assert fig["layout"]["yaxis"]["tickvals"] == labels  # no label is skipped
    assert fig["layout"]["height"] >= charts.ROW_PX * 4
    step = next(t for t in fig["data"] if t["name"] == "step")
    assert step["base"][0] == "2026-12-01 12:00:00.000000" and step["customdata"] == [1, 1, 1]
    assert step["marker"]["color"][1] == "#d64545"
    assert fig["layout"]["meta"]["click"] == "step" and fig["layout"]["shapes"] == []  # no current step


def test_the_waterfall_marks_the_current_step_and_carries_every_steps_times_to_move_the_mark():
    from datetime import datetime, timedelta

    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    rows = [{"name": "a", "kind": "step", "position": 1, "attempt": 1, "status": "ok", "started_at": t0,
             "ended_at": t0 + timedelta(milliseconds=40), "duration_ms": 40},
            {"name": "m", "kind": "model", "position": 2, "attempt": 1, "status": "ok",
             "started_at": t0 + timedelta(milliseconds=50), "ended_at": None, "duration_ms": 30},
            {"name": "b", "kind": "step", "position": 2, "attempt": 1, "status": "ok",
             "started_at": t0 + timedelta(milliseconds=45), "ended_at": t0 + timedelta(milliseconds=90),
             "duration_ms": 45}]
    fig = charts.waterfall(rows, current=2)
    meta = fig["layout"]["meta"]
    assert meta["current"] == 2
    assert meta["steps"] == {"1": ["2026-12-01 12:00:00.000000", "2026-12-01 12:00:00.040000"],
                             "2": ["2026-12-01 12:00:00.045000", "2026-12-01 12:00:00.090000"]}
    [band] = fig["layout"]["shapes"]  # over step 2's time: from its first start to its last end
    assert (band["x0"], band["x1"], band["yref"]) == ("2026-12-01 12:00:00.045000", "2026-12-01 12:00:00.090000",
                                                       "paper")
    widths = {t["name"]: t["marker"]["line"]["width"] for t in fig["data"]}
    assert widths == {"step": [0, 2], "model": [2]}  # step 2's bars outlined, step 1's not

    grouped = charts.waterfall([{"name": "fetch", "kind": "step", "position": 1, "last_position": 9,
                                 "started_at": t0, "ended_at": t0 + timedelta(seconds=1), "count": 9, "errors": 0},
                                {"name": "save", "kind": "step", "position": 10, "last_position": 12,
                                 "started_at": t0, "ended_at": t0 + timedelta(seconds=1), "count": 3,
                                 "errors": 0}], aggregated=True, current=5)
    assert grouped["data"][0]["marker"]["line"]["width"] == [2, 0]  # the row whose steps hold step 5
    assert grouped["data"][0]["meta"]["ranges"] == [[1, 9], [10, 12]] and grouped["layout"]["shapes"] == []
