"""Retention: the most specific rule decides, live runs are never purged, the log goes with its run."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

import journal
from journal.models import RetentionRule, Run, RunStatus, SessionEvent
from journal.operations import retention
from tests.agents import crashy  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)


def _run(status: str, days_ago: float, agent: str = "twelve") -> str:
    run_id = journal.start(agent)
    finished = timezone.now() - timedelta(days=days_ago) if status in ("completed", "failed", "cancelled") else None
    Run.objects.filter(id=run_id).update(status=status, finished_at=finished)
    return run_id


def test_purge_deletes_expired_finished_runs_with_their_session_log_and_keeps_the_rest():
    RetentionRule.objects.create(keep_days=30)
    RetentionRule.objects.create(status=RunStatus.FAILED, keep_days=90)  # failures are kept longer
    old_done = _run(RunStatus.COMPLETED, 40)
    young_done = _run(RunStatus.COMPLETED, 10)
    old_failed = _run(RunStatus.FAILED, 40)
    ancient_failed = _run(RunStatus.FAILED, 100)
    live = _run(RunStatus.SUSPENDED, 0)
    Run.objects.filter(id=live).update(created_at=timezone.now() - timedelta(days=400))

    rows = {row.label: row.runs for row in retention.preview()}
    assert rows == {"every agent / failed: 90 days": 1, "every agent / every finished status: 30 days": 1}
    assert retention.purge() == 2
    remaining = set(Run.objects.values_list("id", flat=True))
    assert {str(r) for r in remaining} == {young_done, old_failed, live}
    assert not SessionEvent.objects.filter(run_id__in=[old_done, ancient_failed]).exists()


def test_without_rules_nothing_is_ever_purged(capsys):
    _run(RunStatus.COMPLETED, 4000)
    assert retention.purge() == 0
    call_command("purge")
    assert "no retention rules" in capsys.readouterr().out
    assert Run.objects.count() == 1


def test_the_purge_command_reports_and_deletes(capsys):
    RetentionRule.objects.create(agent="twelve", keep_days=1)
    _run(RunStatus.CANCELLED, 2)
    call_command("purge", "--dry-run")
    assert Run.objects.count() == 1
    call_command("purge")
    assert "purged 1 run(s)" in capsys.readouterr().out
    assert Run.objects.count() == 0
