"""Which workers are alive, for the operators' page: the engine's own test, not a guess in the view."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta

from django.utils import timezone

from journal.driver.recovery import process_alive
from journal.models import Worker
from journal.models.run import lease_seconds

__all__ = ["LEASES_BEFORE_DEAD", "live_workers"]

LEASES_BEFORE_DEAD = 3  # a heartbeat older than this many lease periods: the worker is gone


def live_workers(*, now: datetime | None = None, limit: int = 200) -> list[Worker]:
    """Workers that have not stopped, whose heartbeat is recent (``LEASES_BEFORE_DEAD`` lease periods) and,
    on this host, whose process still exists (a killed worker is dead at once, not a lease later)."""
    now = now or timezone.now()
    alive_after = now - timedelta(seconds=LEASES_BEFORE_DEAD * lease_seconds())
    rows = Worker.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=alive_after).order_by("-heartbeat_at")
    here = socket.gethostname()
    return [w for w in rows[:limit] if w.hostname != here or process_alive(w.pid, w.started_at)]
