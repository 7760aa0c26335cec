"""Beat's sweep (``journal.driver.sweeper``): the runs a Celery worker should be rung for, read as a claim
reads them, on either database."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import journal
from journal.driver import sweeper
from journal.models import Run, RunStatus
from tests.agents import crashy  # noqa: F401 - registers the workflows these tests start
from tests.checks import sqlite_vm_steps

pytestmark = pytest.mark.django_db(transaction=True)


def _ids(n: int) -> list[uuid.UUID]:
    return [uuid.UUID(journal.start("twelve")) for _ in range(n)]


def test_the_sweep_rings_for_every_kind_of_runnable_run_oldest_first_and_for_nothing_else():
    now = timezone.now()
    ids = _ids(10)
    Run.objects.filter(id__in=ids).update(updated_at=now - timedelta(minutes=1))  # rung a while ago
    for i, run_id in enumerate(ids):
        Run.objects.filter(id=run_id).update(created_at=now - timedelta(seconds=100 - i))
    lapsed = {"lease_expires_at": now - timedelta(seconds=1), "started_at": now}
    Run.objects.filter(id=ids[1]).update(status=RunStatus.SUSPENDED, wake_at=now + timedelta(hours=1))
    Run.objects.filter(id=ids[2]).update(status=RunStatus.SUSPENDED, wake_at=now - timedelta(seconds=1))
    Run.objects.filter(id=ids[3]).update(status=RunStatus.RUNNING, lease_owner="gone", **lapsed)
    Run.objects.filter(id=ids[4]).update(paused=True)
    Run.objects.filter(id=ids[5]).update(status=RunStatus.COMPENSATING, lease_owner="")
    Run.objects.filter(id=ids[6]).update(status=RunStatus.RUNNING, lease_owner="alive",
                                         lease_expires_at=now + timedelta(seconds=30), started_at=now)
    Run.objects.filter(id=ids[7]).update(status=RunStatus.COMPLETED)
    Run.objects.filter(id=ids[8]).update(updated_at=now)  # a pending run rung a moment ago: its message is out

    expected = [ids[0], ids[2], ids[3], ids[5], ids[9]]
    assert sweeper.runnable_ids(now=now) == [str(i) for i in expected]
    assert sweeper.runnable_ids(2, now=now) == [str(i) for i in expected[:2]]
    later = now + timedelta(hours=2)  # the timer due, the live lease lapsed, the rung pending run rung long ago
    assert sweeper.runnable_ids(now=later) == [str(ids[i]) for i in (0, 1, 2, 3, 5, 6, 8, 9)]


def test_the_sweep_leaves_out_the_children_a_fan_outs_limit_holds_back():
    """As a claim does: ringing for a child no worker may start yet only fills the queue."""
    now = timezone.now() - timedelta(minutes=1)
    group = {"concurrency_key": "parent:3", "concurrency_limit": 1}
    running = Run.objects.create(agent="twelve", input={}, status=RunStatus.RUNNING, lease_owner="alive",
                                 lease_expires_at=timezone.now() + timedelta(seconds=30), **group)
    waiting = Run.objects.create(agent="twelve", input={}, **group)
    Run.objects.filter(id=waiting.id).update(updated_at=now)
    assert sweeper.runnable_ids() == []
    Run.objects.filter(id=running.id).update(status=RunStatus.COMPLETED)
    assert sweeper.runnable_ids() == [str(waiting.id)]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite read the one ORed condition whole; "
                    "PostgreSQL plans it well")
def test_the_sweep_does_not_read_the_whole_backlog():
    """Beat asks every few seconds. Read as one ORed condition, SQLite took every pending run and every
    suspended one and sorted them: its work grew with the backlog (a claim: 0.4 ms at 100 pending,
    6.6 ms at 10,000)."""
    later = timezone.now() + timedelta(days=3)

    def backlog(n: int) -> int:
        Run.objects.bulk_create([
            Run(agent="twelve", input={}, status=RunStatus.SUSPENDED if i % 2 else RunStatus.PENDING,
                wake_at=later if i % 2 else None) for i in range(n - Run.objects.count())])
        sweeper.runnable_ids(5, grace_seconds=0)  # compiled, cached
        return sqlite_vm_steps(lambda: sweeper.runnable_ids(5, grace_seconds=0))

    small, large = backlog(50), backlog(2000)
    assert large < small * 1.5, (small, large)
    assert len(sweeper.runnable_ids(5, grace_seconds=0)) == 5
