"""Recovery at start-up: a worker that starts takes over at once the runs of its own host's dead workers.

A lease is how the engine notices a dead worker anywhere, but it costs up to one TTL (30 s by
default) before another worker may claim. On the worker's own host the engine can know for
sure: a worker whose process is gone (its pid no longer exists, or now belongs to a process
that started after the worker registered: a reused pid) is dead, and its leases are expired
now, so the new worker's first claim recovers them. A worker paused by SIGSTOP still exists and
keeps its lease (fencing handles it). Hosts that vanish whole keep the lease path.
"""

from __future__ import annotations

import logging
import socket
from datetime import timedelta

import psutil
from django.utils import timezone

from journal.driver import leases
from journal.models import Worker

log = logging.getLogger(__name__)
CLOCK_SLACK = timedelta(seconds=2)  # a process's start time (from the kernel) vs. the row's (from Django)


def process_alive(pid: int, registered_at) -> bool:
    """True when ``pid`` is the process that registered at ``registered_at`` and it still runs."""
    try:
        started = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, ValueError):
        return False
    return started <= (registered_at + CLOCK_SLACK).timestamp()


def dead_local_workers(*, hostname: str | None = None, exclude: str = "") -> list[Worker]:
    hostname = hostname or socket.gethostname()
    candidates = Worker.objects.filter(hostname=hostname, stopped_at__isnull=True).exclude(id=exclude)
    return [w for w in candidates if not process_alive(w.pid, w.started_at)]


def take_over_dead_local_workers(worker_id: str) -> int:
    """Expire the leases of this host's dead workers and mark them stopped; returns how many runs were freed."""
    freed = 0
    for dead in dead_local_workers(exclude=worker_id):
        runs = leases.expire_worker(dead.id)
        Worker.objects.filter(id=dead.id, stopped_at__isnull=True).update(stopped_at=timezone.now())
        if runs:
            log.warning("worker %s: worker %s (pid %s) is gone; its %d run(s) are recovered now, not after their "
                        "leases expire", worker_id, dead.id, dead.pid, runs)
        freed += runs
    return freed
