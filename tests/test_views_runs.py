"""The runs list: filters, sort, keyset pages, the live fragment, bulk actions, query counts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from journal.models import Run, RunStatus
from runs.models import AuditEntry
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo(drive):
    return make_demo_runs(drive)


def _login(client, personas, role="viewer"):
    client.force_login(personas[role])
    return client


def test_list_shows_runs_and_filters_by_status_agent_and_text(client, personas, demo):
    _login(client, personas)
    page = client.get(reverse("run_list")).content.decode()
    for run_id in (demo.ok, demo.failed, demo.waiting):
        assert run_id[:8] in page
    failed = client.get(reverse("run_list"), {"status": "failed"}).content.decode()
    assert demo.failed[:8] in failed and demo.ok[:8] not in failed
    by_agent = client.get(reverse("run_list"), {"agent": "dash_ok"}).content.decode()
    assert demo.ok[:8] in by_agent and demo.failed[:8] not in by_agent
    by_version = client.get(reverse("run_list"), {"version": "2"}).content.decode()
    assert demo.ok[:8] in by_version and demo.waiting[:8] not in by_version
    text = client.get(reverse("run_list"), {"q": "unexpected token"}).content.decode()
    assert demo.failed[:8] in text and demo.ok[:8] not in text
    by_input = client.get(reverse("run_list"), {"q": "contract.pdf"}).content.decode()
    assert demo.waiting[:8] in by_input and demo.ok[:8] not in by_input
    by_id = client.get(reverse("run_list"), {"q": demo.ok}).content.decode()
    assert demo.ok[:8] in by_id and demo.failed[:8] not in by_id


def _listed(client, q) -> set[str]:
    import re

    body = client.get(reverse("run_list"), {"q": q}).content.decode()
    return set(re.findall(r'href="/runs/([0-9a-f-]{36})/"', body))


def test_the_short_ids_the_pages_show_can_be_searched(client, personas, demo):
    _login(client, personas)
    everyone = {demo.ok, demo.failed, demo.waiting, demo.evil, demo.evil_failed, demo.review}
    for run_id in everyone:
        assert run_id in _listed(client, run_id[:8])  # the 8 characters every page shows
        assert _listed(client, run_id[:8]) == {r for r in everyone if r.startswith(run_id[:8])}
        assert run_id in _listed(client, run_id[:13].upper())  # with the dash, in capitals
    assert _listed(client, "zzzzzzzz") == set()


def test_bad_filter_values_are_explained_not_crashed(client, personas, demo):
    _login(client, personas)
    resp = client.get(reverse("run_list"), {"since": "yesterday-ish", "status": "bogus", "sort": "nope",
                                            "after": "!!!"})
    assert resp.status_code == 200
    body = resp.content.decode()
    assert "is not a date" in body and "unknown status" in body and "cannot sort by" in body
    assert "page link is damaged" in body


def test_time_range_filter(client, personas, demo):
    _login(client, personas)
    assert demo.ok[:8] not in client.get(reverse("run_list"), {"until": "2000-01-01"}).content.decode()
    assert demo.ok[:8] in client.get(reverse("run_list"), {"since": "2000-01-01"}).content.decode()


def test_keyset_pages_walk_every_run_once_in_both_directions(client, personas, drive):
    import journal

    ids = {journal.start("dash_ok", f"doc-{i}") for i in range(7)}
    _login(client, personas)
    from runs import queries

    for sort in ("-created", "created", "agent", "-status", "steps"):
        f = queries.RunFilter.from_query(_qd({"sort": sort}))
        seen, pages, cursor = [], [], ""
        while True:
            page = queries.runs_page(f, after=cursor, size=3)
            pages.append(page)
            seen += [str(r.id) for r in page.runs]
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)), sort
        # back from the last page reproduces the previous page exactly
        back = queries.runs_page(f, before=pages[-1].prev_cursor, size=3)
        assert [r.id for r in back.runs] == [r.id for r in pages[-2].runs], sort


def _qd(d):
    from django.http import QueryDict

    q = QueryDict(mutable=True)
    q.update(d)
    return q


def test_sort_links_and_filters_stay_in_the_url(client, personas, demo):
    _login(client, personas)
    body = client.get(reverse("run_list"), {"status": "failed", "sort": "agent"}).content.decode()
    assert "status=failed&amp;sort=-agent" in body


def test_live_fragment_stops_polling_when_nothing_is_live(client, personas, demo):
    _login(client, personas)
    live = client.get(reverse("run_list_live"), {"ids": demo.waiting})
    assert live.status_code == 200 and f'id="st-{demo.waiting}"' in live.content.decode()
    assert 'hx-swap-oob="true"' in live.content.decode()
    done = client.get(reverse("run_list_live"), {"ids": f"{demo.ok},{demo.failed}"})
    assert done.status_code == 286
    assert client.get(reverse("run_list_live"), {"ids": "not-a-uuid"}).status_code == 286
    page = client.get(reverse("run_list")).content.decode()
    assert "live-poller" in page and demo.waiting in page.split("live-poller")[1]
    only_done = client.get(reverse("run_list"), {"status": "completed"}).content.decode()
    assert "live-poller" not in only_done


def test_bulk_cancel_cancels_selected_runs_and_audits_each(client, personas, demo):
    _login(client, personas, "operator")
    resp = client.post(reverse("run_bulk"), {"action": "cancel", "run_ids": [demo.waiting, demo.ok],
                                             "reason": "incident 42", "next": "/?status=suspended"})
    assert resp.status_code == 302 and resp["Location"] == "/?status=suspended"
    assert Run.objects.get(id=demo.waiting).status == RunStatus.CANCELLED
    entries = {str(e.run_id): e for e in AuditEntry.objects.filter(action="cancel")}
    assert entries[demo.waiting].ok and entries[demo.waiting].comment == "incident 42"
    assert demo.ok not in entries  # a completed run is skipped (counted), never handed to the engine


def _messages(resp) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in resp.context["messages"]]


def test_bulk_retry_of_completed_runs_counts_them_as_skipped_not_errors(client, personas, demo):
    _login(client, personas, "operator")
    resp = client.post(reverse("run_bulk"), {"action": "retry", "run_ids": [demo.ok, demo.evil, demo.failed],
                                             "next": "/"}, follow=True)
    msgs = _messages(resp)
    assert ("warning", "retry: 2 skipped: completed") in msgs
    assert ("success", "retry: 1 run(s) retry scheduled") in msgs
    assert not [m for m in msgs if m[0] == "error"]
    assert Run.objects.get(id=demo.failed).status == RunStatus.PENDING
    assert [str(e.run_id) for e in AuditEntry.objects.filter(action="retry")] == [demo.failed]


def test_bulk_cancel_says_requested_for_running_runs_and_cancelled_for_idle_ones(client, personas, demo):
    import journal

    running = journal.start("dash_ok", "held.txt")
    Run.objects.filter(id=running).update(status=RunStatus.RUNNING, lease_owner="w-1",
                                          lease_expires_at=timezone.now() + timedelta(hours=1))
    _login(client, personas, "operator")
    resp = client.post(reverse("run_bulk"), {"action": "cancel", "run_ids": [demo.waiting, running], "next": "/"},
                       follow=True)
    msgs = _messages(resp)
    assert ("success", "cancel: 1 run(s) cancelled") in msgs
    assert ("info", "cancel: cancellation requested for 1 running run(s); each stops at its next step boundary") \
        in msgs
    assert not any("done" in text for _, text in msgs)
    held = Run.objects.get(id=running)
    assert held.status == RunStatus.RUNNING and held.cancel_requested


def test_bulk_refuses_unknown_actions_and_unsafe_redirects(client, personas, demo):
    _login(client, personas, "operator")
    resp = client.post(reverse("run_bulk"), {"action": "delete", "run_ids": [demo.ok], "next": "//evil.example"})
    assert resp["Location"] == "/"
    assert Run.objects.get(id=demo.ok).status == RunStatus.COMPLETED
    assert not AuditEntry.objects.exists()


def test_list_query_count_does_not_grow_with_rows(client, personas, drive, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import journal

    _login(client, personas, "operator")
    counts = []
    for n in (2, 30):
        for i in range(n):
            journal.start("dash_ok", f"bulk-{n}-{i}")
        with CaptureQueriesContext(connection) as ctx:
            resp = client.get(reverse("run_list"))
        counts.append(len(ctx))
    assert resp.content.decode().count('class="status-cell"') == 32
    assert counts[0] == counts[1], counts
    with django_assert_max_num_queries(12):
        client.get(reverse("run_list"), {"q": "bulk", "status": "pending", "sort": "agent"})


def test_progress_bars_are_full_for_completed_runs_and_labels_carry_numbers(client, personas, demo):
    import journal

    live = journal.start("dash_ok", "contracts.zip")
    Run.objects.filter(id=live).update(progress={"done": 37, "total": 120, "label": "contracts"})
    Run.objects.filter(id=demo.ok).update(progress={"done": 1, "total": 2, "label": "documents"})  # ended early
    _login(client, personas)
    body = client.get(reverse("run_list")).content.decode()
    live_cell = body.split(f'id="pg-{live}"')[1].split("</td>")[0]
    assert 'value="31"' in live_cell and "37 / 120 contracts" in live_cell
    done_cell = body.split(f'id="pg-{demo.ok}"')[1].split("</td>")[0]
    assert 'value="100"' in done_cell and "2 / 2 documents" in done_cell
    page = client.get(reverse("run_detail", args=[demo.ok])).content.decode()
    header = page.split('id="header-steps"')[1].split("</dd>")[0]
    assert 'value="100"' in header and "2 / 2 documents" in header


def test_search_by_what_happened_with_key_value_terms(client, personas, demo):
    _login(client, personas)
    everyone = {demo.ok, demo.failed, demo.waiting, demo.evil, demo.evil_failed, demo.review}
    assert _listed(client, "step:summarize_doc") == {demo.ok, demo.failed}  # dash_ok and dash_fail ran it
    assert _listed(client, "failed_step:explode") == {demo.failed}
    assert _listed(client, "failed_step:summarize_doc") == set()  # ran it, did not fail there
    assert _listed(client, 'error:"unexpected token"') == {demo.failed}
    assert _listed(client, "status:failed") == {demo.failed, demo.evil_failed}
    assert _listed(client, "status:failed step:fetch_doc") == {demo.failed}  # terms combine with AND
    assert _listed(client, f"id:{demo.review[:8]} agent:dash_review") == {demo.review}
    assert _listed(client, "agent:dash_ok report") == {demo.ok}  # a term and free text
    assert _listed(client, "") == everyone
    assert "failed_step:</code>" in client.get(reverse("run_list")).content.decode()  # the help lists the terms


def test_a_bad_search_term_is_a_message_in_the_page_not_a_500(client, personas, demo):
    _login(client, personas)
    for q, message in [("colour:red", "unknown search term colour:"), ("status:sideways", "is not a status"),
                       ("id:xyz", "is not a run id or the start of one"), ('step:""', "step: needs a value")]:
        resp = client.get(reverse("run_list"), {"q": q})
        assert resp.status_code == 200 and message in resp.content.decode(), q


def test_act_on_every_run_matching_a_search_counts_first_then_acts(client, personas, demo):
    _login(client, personas, "operator")
    search = {"scope": "filter", "q": "agent:dash_fail", "action": "retry", "next": "/?q=agent:dash_fail"}
    dry = client.post(reverse("run_bulk"), {**search, "dry_run": "1"})
    assert dry.json() == {"action": "retry", "count": 1, "by_status": {"failed": 1}, "dry_run": True}
    everything = client.post(reverse("run_bulk"), {"scope": "filter", "action": "retry", "dry_run": "1",
                                                   "status": ["failed", "completed"]}).json()
    assert everything["count"] == 4 and everything["by_status"] == {"failed": 2, "completed": 2}
    assert Run.objects.get(id=demo.failed).status == RunStatus.FAILED and not AuditEntry.objects.exists()
    page = client.post(reverse("run_bulk"), {**search, "dry_run": "1"}, HTTP_HX_REQUEST="true").content.decode()
    assert '<strong>1</strong> run match this search (1 failed)' in page and "Retry all 1" in page
    bad = client.post(reverse("run_bulk"), {**search, "q": "colour:red", "dry_run": "1"})
    assert bad.status_code == 400 and "unknown search term" in bad.json()["error"]

    resp = client.post(reverse("run_bulk"), {"scope": "filter", "action": "retry", "status": ["failed", "completed"],
                                             "next": "/"}, follow=True)
    msgs = _messages(resp)
    assert ("success", "retry: 2 run(s) retry scheduled") in msgs and ("warning", "retry: 2 skipped: completed") in msgs
    assert Run.objects.get(id=demo.failed).status == RunStatus.PENDING
    assert AuditEntry.objects.filter(action="retry", ok=True).count() == 2


def test_the_list_offers_the_count_first_only_when_a_search_is_active(client, personas, demo):
    _login(client, personas, "operator")
    assert 'id="filter-count-btn"' not in client.get(reverse("run_list")).content.decode()
    body = client.get(reverse("run_list"), {"q": "status:failed"}).content.decode()
    assert 'id="filter-count-btn"' in body and '<input type="hidden" name="q" value="status:failed">' in body
    assert 'name="q" value="status:failed" placeholder=' in body  # the search box keeps what was typed
    bulk_form = body[body.index('id="bulk"'):]
    assert 'name="scope"' not in bulk_form  # ticking runs and pressing Cancel… never acts on the whole search
