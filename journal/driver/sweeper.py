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

from django.utils import timezone

from journal.driver import leases
from journal.models import RunStatus, Worker


def runnable_ids(limit: int = 500, *, grace_seconds: float = 5.0, now=None) -> list[str]:
    """Ids of runs a worker should claim now, oldest first.

    Read as a claim reads them (``leases.oldest_runnable``: each kind of runnable run along its own
    index), not as one ORed condition, which made SQLite read and sort every pending run on every
    beat. So it also leaves out, as a claim does, a fan-out's children that its limit holds back.
    Twice ``limit`` are read so that pending runs rung a moment ago, dropped here, rarely crowd out
    older ones; those left over are the next beat's."""
    now = now or timezone.now()
    fresh = now - timedelta(seconds=grace_seconds)
    ids = [str(row["id"]) for row in leases.oldest_runnable(2 * limit, now)
           if not (row["status"] == RunStatus.PENDING and row["updated_at"] > fresh)]
    return ids[:limit]


def stale_workers(max_silence_seconds: float, now=None) -> int:
    """Mark workers that stopped heartbeating as stopped (for the workers page); their runs are
    already claimable through their expired leases."""
    now = now or timezone.now()
    return Worker.objects.filter(stopped_at__isnull=True,
                                 heartbeat_at__lt=now - timedelta(seconds=max_silence_seconds)).update(stopped_at=now)
