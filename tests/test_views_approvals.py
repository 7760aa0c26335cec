"""The approvals inbox: approvals and signal waits, oldest first; accept, edit, reject, respond."""

from __future__ import annotations

import pytest
from django.urls import reverse

from journal.models import Approval, Run, RunStatus
from runs.models import AuditEntry
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo(drive):
    return make_demo_runs(drive)


def login(client, personas, role):
    client.force_login(personas[role])
    return client


def test_inbox_lists_waiting_runs_with_prompt_context_role_and_badge(client, personas, demo):
    body = login(client, personas, "viewer").get(reverse("approvals")).content.decode()
    assert "Publish press-release.md?" in body and "risk" in body and "who may decide: operator" in body
    assert "waiting for signal" in body and demo.waiting[:8] in body
    assert 'id="approvals-badge"' in body and ">2</span>" in body
    assert "Accept" not in body  # a viewer sees the inbox, not the buttons


def test_accepting_an_approval_resumes_the_run(client, personas, demo, drive):
    approval = Approval.objects.get(run_id=demo.review)
    resp = login(client, personas, "operator").post(reverse("approval_decide"), {
        "approval_id": str(approval.id), "decision": "accept", "comment": "looks fine"}, HTTP_HX_REQUEST="true")
    body = resp.content.decode()
    assert resp.status_code == 200 and body.lstrip().startswith('<div id="inbox"') and "accepted" in body
    assert "Publish press-release.md?" not in body
    drive()
    run = Run.objects.get(id=demo.review)
    assert run.status == RunStatus.COMPLETED and run.output["published"] is True
    entry = AuditEntry.objects.get(action="approval_accept")
    assert entry.ok and entry.comment == "looks fine" and str(entry.run_id) == demo.review


def test_edit_then_accept_records_the_edited_value(client, personas, demo, drive):
    approval = Approval.objects.get(run_id=demo.review)
    login(client, personas, "operator").post(reverse("approval_decide"), {
        "approval_id": str(approval.id), "decision": "edit", "edited": '{"title": "Better"}'})
    decision = approval.decisions.get()
    assert decision.approved and decision.edited == {"title": "Better"}


def test_reject_and_respond_on_a_signal_wait(client, personas, demo, drive):
    c = login(client, personas, "operator")
    body = c.post(reverse("approval_decide"), {"run_id": demo.waiting, "decision": "respond"},
                  HTTP_HX_REQUEST="true").content.decode()
    assert "write the response" in body
    c.post(reverse("approval_decide"), {"run_id": demo.waiting, "decision": "reject", "comment": "too risky"})
    drive()
    run = Run.objects.get(id=demo.waiting)
    assert run.status == RunStatus.COMPLETED and run.output["approved"] is False
    assert run.output["decision"]["comment"] == "too risky" and run.output["decision"]["by"] == "operator"


def test_bad_edited_json_is_refused(client, personas, demo):
    approval = Approval.objects.get(run_id=demo.review)
    body = login(client, personas, "operator").post(reverse("approval_decide"), {
        "approval_id": str(approval.id), "decision": "edit", "edited": "{bad"},
        HTTP_HX_REQUEST="true").content.decode()
    assert "not valid JSON" in body and not approval.decisions.exists()


def test_a_second_vote_is_refused_with_the_engine_message(client, personas, demo):
    approval = Approval.objects.get(run_id=demo.review)
    c = login(client, personas, "operator")
    c.post(reverse("approval_decide"), {"approval_id": str(approval.id), "decision": "reject"})
    body = c.post(reverse("approval_decide"), {"approval_id": str(approval.id), "decision": "accept"},
                  HTTP_HX_REQUEST="true").content.decode()
    assert "already" in body
    assert [e.ok for e in AuditEntry.objects.order_by("id")] == [True, False]


def test_empty_inbox_says_what_to_do(client, personas, db):
    body = login(client, personas, "viewer").get(reverse("approvals")).content.decode()
    assert "Nothing is waiting for a decision" in body


def test_inbox_query_count_does_not_grow_with_rows(client, personas, drive, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import journal

    c = login(client, personas, "operator")
    counts = []
    for n in (1, 6):
        for i in range(n):
            journal.start("dash_review", f"doc-{n}-{i}")
            journal.start("dash_approval", f"doc-{n}-{i}")
        drive()
        with CaptureQueriesContext(connection) as ctx:
            c.get(reverse("approvals"))
        counts.append(len(ctx))
    assert counts[0] == counts[1], counts


def test_the_navigation_badge_is_a_polled_fragment_that_counts_waiting_decisions(personas, drive):
    from django.test import Client

    make_demo_runs(drive)
    client = Client()
    client.force_login(personas["viewer"])
    page = client.get(reverse("run_list")).content.decode()
    assert 'hx-get="/approvals/badge/"' in page
    fragment = client.get(reverse("approvals_badge"), HTTP_HX_REQUEST="true").content.decode()
    assert fragment.startswith('<span id="approvals-badge"') and 'class="badge"' in fragment
    assert "<html" not in fragment
