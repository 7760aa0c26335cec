"""The retention page: admins set rules, see what a purge would delete, and purge; all audited."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import journal
from journal.models import RetentionRule, Run, RunStatus
from runs.models import AuditEntry
from tests.agents import crashy  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_admin_sets_a_rule_previews_and_purges(personas):
    old = journal.start("twelve")
    Run.objects.filter(id=old).update(status=RunStatus.COMPLETED, finished_at=timezone.now() - timedelta(days=9))
    client = Client()
    client.force_login(personas["admin"])
    page = client.get(reverse("retention"))
    assert b"No rules yet" in page.content
    client.post(reverse("retention_set"), {"agent": "twelve", "status": "", "keep_days": "7"})
    rule = RetentionRule.objects.get()
    assert (rule.agent, rule.keep_days, rule.created_by) == ("twelve", 7, "admin")
    assert b"1 run" in client.get(reverse("retention")).content  # the preview
    client.post(reverse("retention_purge"), {"comment": "disk is full"})
    assert not Run.objects.filter(id=old).exists()
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "ok"))
    assert actions == [("retention_set", True), ("retention_purge", True)]


def test_a_bad_rule_is_refused_with_a_message_and_changes_nothing(personas):
    client = Client()
    client.force_login(personas["admin"])
    response = client.post(reverse("retention_set"), {"status": "running", "keep_days": "7"}, follow=True)
    assert b"retention applies to finished runs" in response.content
    response = client.post(reverse("retention_set"), {"keep_days": "soon"}, follow=True)
    assert b"whole number" in response.content
    assert RetentionRule.objects.count() == 0


def test_an_operator_cannot_change_retention(personas):
    client = Client()
    client.force_login(personas["operator"])
    assert client.post(reverse("retention_set"), {"keep_days": "1"}).status_code == 403
    assert RetentionRule.objects.count() == 0
