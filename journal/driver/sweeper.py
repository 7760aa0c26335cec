"""The sweeper: find runs that need a worker now, for schedulers that do not poll the database themselves.

The embedded worker needs no sweeper (its claim query is the sweep). Celery workers only act
when a message arrives, so beat calls ``runnable_ids()`` periodically and rings for each run:
due timers (including approval expiries), expired leases of dead workers, and pending runs
whose message was lost. A pending run that was notified a moment ago is skipped for a grace
period so the queue does not fill with duplicates; duplicates would be harmless anyway, since
the database lease decides who advances a run.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from journal.models import Run, RunStatus, Worker


def runnable_ids(limit: int = 500, *, grace_seconds: float = 5.0, now=None) -> list[str]:
    """Ids of runs a worker should claim now, oldest first."""
    now = now or timezone.now()
    fresh_pending = Q(status=RunStatus.PENDING, updated_at__gt=now - timedelta(seconds=grace_seconds))
    ids = (
        Run.objects.runnable(now).exclude(fresh_pending).order_by("created_at").values_list("id", flat=True)[:limit]
    )
    return [str(i) for i in ids]


def stale_workers(max_silence_seconds: float, now=None) -> int:
    """Mark workers that stopped heartbeating as stopped (for the workers page); their runs are
    already claimable through their expired leases."""
    now = now or timezone.now()
    return Worker.objects.filter(stopped_at__isnull=True,
                                 heartbeat_at__lt=now - timedelta(seconds=max_silence_seconds)).update(stopped_at=now)
