"""Every dashboard URL × every role (anonymous, viewer, operator, admin) against an explicit table."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from journal.models import Approval
from runs.models import AuditEntry
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ("anonymous", "viewer", "operator", "admin")
VIEWERS, OPERATORS, ADMINS = {"viewer", "operator", "admin"}, {"operator", "admin"}, {"admin"}

# name -> (method, who may, status when allowed); the arguments are filled in by `target`.
TABLE = {
    "run_list": ("get", VIEWERS, 200),
    "run_list_live": ("get", VIEWERS, 200),
    "run_detail": ("get", VIEWERS, 200),
    "run_header": ("get", VIEWERS, 200),
    "run_tail": ("get", VIEWERS, 200),
    "run_events": ("get", VIEWERS, 200),
    "run_compare": ("get", VIEWERS, 200),
    "run_thread": ("get", VIEWERS, 404),  # a run that drives no LangGraph graph: its page says so, for viewers up
    "bulk_job": ("get", VIEWERS, 200),
    "event_payload": ("get", VIEWERS, 200),
    "approvals": ("get", VIEWERS, 200),
    "approvals_badge": ("get", VIEWERS, 200),
    "workers": ("get", VIEWERS, 200),
    "overview": ("get", VIEWERS, 200),
    "audit": ("get", OPERATORS, 200),
    "roles": ("get", ADMINS, 200),
    "run_bulk": ("post", OPERATORS, 302),
    "run_act": ("post", OPERATORS, 200),
    "approval_decide": ("post", OPERATORS, 200),
    "agent_act": ("post", OPERATORS, 302),
    "set_role": ("post", ADMINS, 302),
    "retention": ("get", ADMINS, 200),
    "retention_set": ("post", ADMINS, 302),
    "retention_delete": ("post", ADMINS, 302),
    "retention_purge": ("post", ADMINS, 302),
    "erasure": ("get", ADMINS, 200),
    "erasure_erase": ("post", ADMINS, 302),
}
PUBLIC = {"login", "logout", "favicon"}  # favicon: a redirect to a static file


def target(name: str, demo) -> tuple[str, dict]:
    """(url, data) for one row of the table, pointing at real runs."""
    approval = Approval.objects.get(run_id=demo.review)
    return {
        "run_list": (reverse("run_list"), {}),
        "run_list_live": (reverse("run_list_live"), {"ids": demo.waiting}),
        "run_detail": (reverse("run_detail", args=[demo.ok]), {}),
        "run_header": (reverse("run_header", args=[demo.waiting]), {}),
        "run_tail": (reverse("run_tail", args=[demo.waiting]), {}),
        "run_events": (reverse("run_events", args=[demo.ok]), {"after": "0", "until": "3"}),
        "run_compare": (reverse("run_compare"), {"a": demo.ok, "b": demo.failed}),
        "run_thread": (reverse("run_thread", args=[demo.ok]), {}),
        "bulk_job": (reverse("bulk_job", args=[_finished_bulk_job()]), {}),
        "event_payload": (reverse("event_payload", args=[demo.ok, 1]), {}),
        "approvals": (reverse("approvals"), {}),
        "approvals_badge": (reverse("approvals_badge"), {}),
        "workers": (reverse("workers"), {}),
        "overview": (reverse("overview"), {}),
        "audit": (reverse("audit"), {}),
        "roles": (reverse("roles"), {}),
        "run_bulk": (reverse("run_bulk"), {"action": "cancel", "run_ids": [demo.failed], "next": "/"}),
        "run_act": (reverse("run_act", args=[demo.waiting, "pause"]), {"reason": "authz"}),
        "approval_decide": (reverse("approval_decide"), {"approval_id": str(approval.id), "decision": "accept"}),
        "agent_act": (reverse("agent_act", args=["dash_ok"]), {"action": "pause_agent"}),
        "set_role": (reverse("set_role"), {"username": "viewer", "role": "viewer"}),
        "retention": (reverse("retention"), {}),
        "retention_set": (reverse("retention_set"), {"agent": "", "status": "failed", "keep_days": "90"}),
        "retention_delete": (reverse("retention_delete", args=[_rule_id()]), {}),
        "retention_purge": (reverse("retention_purge"), {}),
        "erasure": (reverse("erasure"), {"subject": "nobody"}),
        "erasure_erase": (reverse("erasure_erase"), {"subject": "nobody", "reason": "authz"}),
    }[name]


def _finished_bulk_job() -> str:
    from runs.models.bulk import BulkJob, BulkJobStatus

    return str(BulkJob.objects.create(actor="operator", action="cancel", status=BulkJobStatus.FINISHED).id)


def _rule_id() -> int:
    from journal.models import RetentionRule

    return RetentionRule.objects.get_or_create(agent="nobody", status="", defaults={"keep_days": 3650})[0].pk


def test_the_table_covers_every_dashboard_url():
    from runs import urls

    names = {p.name for p in urls.urlpatterns}
    assert names == set(TABLE) | PUBLIC


@pytest.mark.parametrize("role", ROLES)
def test_every_url_for_every_role(role, personas, drive):
    demo = make_demo_runs(drive)
    client = Client()
    if role != "anonymous":
        client.force_login(personas[role])
    for name, (method, allowed, ok_status) in TABLE.items():
        url, data = target(name, demo)
        before = AuditEntry.objects.count()
        resp = getattr(client, method)(url, data, HTTP_HX_REQUEST="true") if method == "post" and name in (
            "run_act", "approval_decide") else getattr(client, method)(url, data)
        if role == "anonymous":
            assert resp.status_code == 302 and resp["Location"].startswith("/login/"), (name, resp.status_code)
        elif role in allowed:
            assert resp.status_code in (ok_status, 286), (name, role, resp.status_code)
        else:
            assert resp.status_code == 403, (name, role, resp.status_code)
            assert AuditEntry.objects.count() == before, name  # a refused request does nothing at all


def test_login_page_and_logout(client, personas):
    assert client.get(reverse("login")).status_code == 200
    resp = client.post(reverse("login"), {"username": "viewer", "password": "viewer-pass"})
    assert resp.status_code == 302
    assert client.get(reverse("run_list")).status_code == 200
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("run_list")).status_code == 302


def test_a_user_without_a_role_is_refused(client, db, personas):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("nobody", password="x"))
    assert client.get(reverse("run_list")).status_code == 403


def test_csrf_is_enforced_and_the_htmx_header_carries_the_token(personas, drive):
    demo = make_demo_runs(drive)
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas["operator"])
    url = reverse("run_act", args=[demo.waiting, "pause"])
    assert client.post(url, HTTP_HX_REQUEST="true").status_code == 403
    page = client.get(reverse("run_detail", args=[demo.waiting])).content.decode()
    token = re.search(r'hx-headers=\'\{"X-CSRFToken": "([^"]+)"\}\'', page).group(1)
    assert client.post(url, HTTP_HX_REQUEST="true", HTTP_X_CSRFTOKEN=token).status_code == 200


def test_role_change_by_an_admin_is_audited(client, personas):
    client.force_login(personas["admin"])
    client.post(reverse("set_role"), {"username": "viewer", "role": "operator"})
    assert personas["viewer"].groups.filter(name="operator").exists()
    entry = AuditEntry.objects.get(action="role_change")
    assert entry.actor == "admin" and "viewer is now operator" in entry.result
