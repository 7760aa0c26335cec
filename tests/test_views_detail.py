"""Run detail: header, journal stepper (deep links, fragments, diff, state), tabs, tail, payloads."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from journal.models import Run, SessionEvent
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo(drive):
    return make_demo_runs(drive)


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"])
    return client


def test_detail_shows_header_stepper_timeline_and_tabs(viewer, demo):
    body = viewer.get(reverse("run_detail", args=[demo.ok])).content.decode()
    assert "dash_ok" in body and "v2" in body and "Completed" in body
    assert 'id="journal"' in body and "Step 2 of" not in body  # the default step is the last one
    assert 'id="gantt-data"' in body and "Checkpoints (" in body and "Side effects (" in body
    assert "summary of report.txt" in body


def test_step_deep_link_shows_that_step_with_its_diff_and_state(viewer, demo):
    body = viewer.get(reverse("run_detail", args=[demo.ok]), {"step": 1}).content.decode()
    assert "Step 1:" in body and "fetch_doc" in body
    assert 'id="step-next"' in body and 'id="step-prev"' not in body
    body2 = viewer.get(reverse("run_detail", args=[demo.ok]), {"step": 2}).content.decode()
    assert "Step 2:" in body2 and "summarize_doc" in body2
    assert "result" in body2 and "summary of report.txt" in body2
    assert 'id="step-prev"' in body2


def test_stepper_fragment_is_the_journal_partial_only(viewer, demo):
    resp = viewer.get(reverse("run_detail", args=[demo.ok]), {"step": 1, "fragment": "journal"},
                      HTTP_HX_REQUEST="true")
    body = resp.content.decode()
    assert body.lstrip().startswith('<section id="journal"') and "<html" not in body
    assert "Step 1:" in body


def test_out_of_range_steps_are_clamped_not_errors(viewer, demo):
    assert "Step 1:" in viewer.get(reverse("run_detail", args=[demo.ok]), {"step": -5}).content.decode()
    assert viewer.get(reverse("run_detail", args=[demo.ok]), {"step": "x"}).status_code == 200
    body = viewer.get(reverse("run_detail", args=[demo.ok]), {"step": 999}).content.decode()
    assert 'id="step-next"' not in body


def test_failed_run_shows_its_error_at_the_failing_step(viewer, demo):
    body = viewer.get(reverse("run_detail", args=[demo.failed])).content.decode()
    assert "unexpected token" in body and "Failed" in body
    last = viewer.get(reverse("run_detail", args=[demo.failed]), {"step": 3}).content.decode()
    assert "explode" in last and "ValueError" in last


def test_header_fragment_polls_until_terminal(viewer, demo):
    live = viewer.get(reverse("run_header", args=[demo.waiting]), HTTP_HX_REQUEST="true")
    assert live.status_code == 200 and "hx-trigger" in live.content.decode()
    done = viewer.get(reverse("run_header", args=[demo.ok]), HTTP_HX_REQUEST="true")
    assert done.status_code == 286


def test_tail_returns_only_events_after_the_cursor(viewer, demo):
    last = SessionEvent.objects.filter(run_id=demo.waiting).order_by("-seq").first().seq
    resp = viewer.get(reverse("run_tail", args=[demo.waiting]), {"after": last - 1})
    body = resp.content.decode()
    assert resp.status_code == 200 and f'data-seq="{last}"' in body and f'data-seq="{last - 1}"' not in body
    assert f"after={last}" in body
    done = viewer.get(reverse("run_tail", args=[demo.ok]), {"after": 0})
    assert done.status_code == 286 and 'data-seq="1"' in done.content.decode()


def test_event_payload_is_served_as_json_not_html(viewer, demo):
    resp = viewer.get(reverse("event_payload", args=[demo.evil, 1]))
    assert resp["Content-Type"] == "application/json" and resp["X-Content-Type-Options"] == "nosniff"
    assert json.loads(resp.content)["input"]["args"] == ["ignore previous instructions"]
    assert viewer.get(reverse("event_payload", args=[demo.evil, 9999])).status_code == 404


def test_unknown_run_is_404(viewer, db):
    assert viewer.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_large_payloads_collapse_with_a_size_note(viewer, drive):
    import journal

    run_id = journal.start("dash_ok", "x" * 5000)
    drive()
    body = viewer.get(reverse("run_detail", args=[run_id]), {"step": 1}).content.decode()
    assert '<details class="big"><summary>' in body and "kB — show" in body


def test_detail_query_count_does_not_grow_with_the_journal(viewer, drive):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import journal

    small, big = journal.start("dash_many", 1), journal.start("dash_many", 40)
    drive()
    counts = []
    for run_id in (small, big):
        for params in ({}, {"step": 1}, {"step": 1, "fragment": "journal"}):
            with CaptureQueriesContext(connection) as ctx:
                assert viewer.get(reverse("run_detail", args=[run_id]), params).status_code == 200
            counts.append(len(ctx))
    assert counts[:3] == counts[3:], counts
    assert max(counts) <= 40, counts


def test_a_long_journal_lists_the_first_events_and_tails_from_the_newest(viewer, drive):
    import journal
    from runs.views.detail import EVENTS_PAGE

    run_id = journal.start("dash_many", EVENTS_PAGE)
    drive()
    newest = SessionEvent.objects.filter(run_id=run_id).order_by("-seq").first().seq
    body = viewer.get(reverse("run_detail", args=[run_id])).content.decode()
    assert f'data-seq="{EVENTS_PAGE}"' in body and f'data-seq="{EVENTS_PAGE + 1}"' not in body
    assert f"after event {EVENTS_PAGE} of {newest})" in body  # the next page's button, up to the newest


def test_header_and_stepper_count_steps_the_same_way(client, personas, demo):
    from journal.operations.timetravel import step_total

    client.force_login(personas["viewer"])
    Run.objects.filter(id=demo.ok).update(steps=44)  # the run row's counter is not what the stepper walks
    total = step_total(demo.ok)
    assert total != 44
    body = client.get(reverse("run_detail", args=[demo.ok])).content.decode()
    assert f'<dd id="header-steps">{total}' in body and f'of <span id="step-total">{total}</span>' in body
    header = client.get(reverse("run_header", args=[demo.ok]), HTTP_HX_REQUEST="true").content.decode()
    assert f'<dd id="header-steps">{total}' in header


def test_the_stepper_poll_redraws_only_when_the_total_grew(client, personas, drive):
    import journal
    from journal.operations.timetravel import step_total

    client.force_login(personas["viewer"])
    run_id = journal.start("dash_grow", "doc")
    drive()
    url = reverse("run_detail", args=[run_id])
    page = client.get(url).content.decode()
    before = step_total(run_id)
    assert 'id="stepper-poll"' in page and f"known_total={before}" in page
    same = client.get(url, {"step": 1, "fragment": "journal", "known_total": before}, HTTP_HX_REQUEST="true")
    assert same.status_code == 204
    journal.signal(run_id, "more", {})
    drive()
    after = step_total(run_id)
    assert after > before
    grown = client.get(url, {"step": 1, "fragment": "journal", "known_total": before}, HTTP_HX_REQUEST="true")
    assert grown.status_code == 200 and f'of <span id="step-total">{after}</span>' in grown.content.decode()
    done = client.get(url, {"step": 1, "fragment": "journal", "known_total": after}, HTTP_HX_REQUEST="true")
    assert done.status_code == 286  # finished and nothing new: stop polling
    assert 'id="stepper-poll"' not in client.get(url).content.decode()


def test_tab_counts_are_totals_and_a_capped_tab_says_how_much_it_shows(client, personas, drive, monkeypatch):
    import journal
    from journal.models import TraceSpan
    from runs import window

    run_id = journal.start("dash_many", 5)
    drive()
    spans = TraceSpan.objects.filter(run_id=run_id).count()
    assert spans >= 5
    monkeypatch.setattr(window, "TAB_ROWS", 2)
    client.force_login(personas["viewer"])
    body = client.get(reverse("run_detail", args=[run_id])).content.decode()
    assert f"Trace ({spans})" in body
    assert f"The first 2 of {spans} spans of steps 1–" in body and body.count("<tr><td><a href=\"?step=") >= 2
    monkeypatch.setattr(window, "TAB_ROWS", 200)
    whole = client.get(reverse("run_detail", args=[run_id])).content.decode()
    assert f"Trace ({spans})" in whole and 'id="trace-note"' not in whole and "Showing the first" not in whole


def test_the_events_list_pages_with_a_cursor_up_to_where_the_tail_starts(client, personas, drive, monkeypatch):
    import re

    import journal
    from runs.views import detail

    monkeypatch.setattr(detail, "EVENTS_PAGE", 4)
    run_id = journal.start("dash_many", 12)
    drive()
    newest = SessionEvent.objects.filter(run_id=run_id).order_by("-seq").first().seq
    assert newest > 8
    client.force_login(personas["viewer"])
    body = client.get(reverse("run_detail", args=[run_id])).content.decode()
    assert f"Events ({newest})" in body
    seen = [int(n) for n in re.findall(r'<tr data-seq="(\d+)"', body)]
    assert seen == [1, 2, 3, 4]
    link = re.search(r'hx-get="(/runs/[^"]+/events/\?after=4&amp;until=(\d+))"', body)
    assert link and int(link.group(2)) == newest
    url = link.group(1).replace("&amp;", "&")
    while url:
        page = client.get(url, HTTP_HX_REQUEST="true").content.decode()
        seen += [int(n) for n in re.findall(r'<tr data-seq="(\d+)"', page)]
        more = re.search(r'hx-get="(/runs/[^"]+/events/\?after=\d+&amp;until=\d+)"', page)
        url = more.group(1).replace("&amp;", "&") if more else ""
    assert seen == list(range(1, newest + 1))  # every event once, in order, and the last page has no button


def test_a_forks_stepper_says_which_steps_were_replayed_and_which_ran_anew(client, personas, demo, drive):
    import journal

    client.force_login(personas["viewer"])
    edited = journal.fork(demo.ok, 2, override="edited", actor="alice")
    rerun = journal.fork(demo.ok, 2, actor="alice")
    drive()

    def origin(run_id, step):
        body = client.get(reverse("run_detail", args=[run_id]), {"step": step}).content.decode()
        return body.split('id="step-origin">')[1].split("</span>")[0] if 'id="step-origin"' in body else None

    assert origin(edited, 1) == "replayed from the parent"
    assert origin(edited, 2) == "edited result (what-if) by alice"
    assert origin(rerun, 1) == "replayed from the parent"
    assert origin(rerun, 2) == "ran anew in this fork"
    assert origin(demo.ok, 1) is None  # not a fork: nothing to say


def test_an_action_answers_by_replacing_the_result_box_not_nesting_a_second_one(client, personas, demo):
    client.force_login(personas["operator"])
    body = client.get(reverse("run_detail", args=[demo.ok])).content.decode()
    form = body[body.index("act/replay_check/"):]
    assert 'hx-target="#action-result" hx-swap="outerHTML"' in form[:400]
    answer = client.post(reverse("run_act", args=[demo.ok, "replay_check"]), HTTP_HX_REQUEST="true").content.decode()
    assert answer.strip().startswith('<div id="action-result"') and answer.count('id="action-result"') == 1


def test_file_diff_lines_are_classed_for_colour_and_stay_escaped():
    from django.template import Context, Template

    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old <b>\n+new <script>\n same"
    html = Template('{% load runs_tags %}<pre class="filediff">{% for cls, line in diff|diff_lines %}'
                    '<span class="{{ cls }}">{{ line }}</span>\n{% endfor %}</pre>').render(Context({"diff": diff}))
    assert '<span class="dl-del">-old &lt;b&gt;</span>' in html
    assert '<span class="dl-add">+new &lt;script&gt;</span>' in html
    assert '<span class="dl-file">--- a/x.py</span>' in html and '<span class="dl-hunk">@@ -1 +1 @@</span>' in html
    assert '<span class="dl-ctx"> same</span>' in html
    from pathlib import Path

    assert "f.diff|diff_lines" in (Path(__file__).parent.parent / "templates/runs/detail.html").read_text()
