"""Celery tasks: the distributed path. A message carries only a run id; the database lease decides.

``advance_run`` claims that one run through ``leases.claim(run_id=...)`` and drives it like the
embedded worker does (same executor, same fencing), so a duplicated or redelivered message
finds the run already claimed or finished and does nothing. Each Celery worker process
registers one ``Worker`` row (kind=celery) and heartbeats the leases of the runs it drives,
reusing EmbeddedWorker's heartbeat; a worker killed mid-run stops heartbeating, its lease
expires, and beat's ``sweep`` rings for the run so another worker recovers it; a Celery worker that
starts on the same host takes such runs at once (``_recover_at_start``). A database outage
retries the task (see ``advance_run``) and never fails the run or stops the Celery worker.
"""

from __future__ import annotations

import logging
import threading

from celery import shared_task
from celery.signals import worker_init, worker_shutting_down
from django.conf import settings
from django.db import close_old_connections, connections

from journal.driver import recovery
from journal.driver.sweeper import runnable_ids, stale_workers
from journal.driver.worker import EmbeddedWorker
from journal.operations import retention
from journal.store.outage import OutageLog, drop_connection, is_database_outage

log = logging.getLogger(__name__)
_outage = OutageLog(log, "celery")

_worker = None
_worker_lock = threading.Lock()


def celery_worker():
    """This process's driver (created on first use: one per Celery worker process, with its heartbeat)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            worker = EmbeddedWorker(concurrency=1, kind="celery")
            worker.register()
            worker._heartbeat_thread = threading.Thread(target=worker._heartbeat_loop, name="durable-heartbeat",
                                                        daemon=True)
            worker._heartbeat_thread.start()
            _worker = worker
        return _worker


@shared_task(bind=True, name="journal.integrations.tasks.advance_run", ignore_result=True, max_retries=None)
def advance_run(self, run_id: str) -> str | None:
    """Claim and drive one run; a no-op (None) when another worker holds it or it is not runnable.

    A database outage (while claiming, or while driving: the run was given back, nothing recorded)
    retries the task with exponential backoff, up to ``DURABLE_CELERY_DB_RETRIES`` times; beat's
    sweep rings for the run again after that. The Celery worker itself is never touched.
    """
    try:
        close_old_connections()
        status = celery_worker().drive_one(run_id)
    except Exception as exc:
        if not is_database_outage(exc):
            raise
        _outage.failed(exc)
        status = "unavailable"
    finally:
        _close_quietly()
    log.info("advance_run %s -> %s", run_id, status)
    if status == "unavailable":
        retries = self.request.retries or 0
        if retries >= int(getattr(settings, "DURABLE_CELERY_DB_RETRIES", 30)):
            log.warning("advance_run %s: the database stayed unavailable; beat's sweep will ring again", run_id)
            return status
        raise self.retry(countdown=min(60.0, 0.5 * 2 ** retries))
    _outage.answered()
    if _worker is not None:
        _worker.db.answered()
    return status


def _close_quietly() -> None:
    try:
        close_old_connections()
    except Exception as exc:
        if not is_database_outage(exc):
            raise
        drop_connection()


@shared_task(name="journal.integrations.tasks.sweep", ignore_result=True)
def sweep(limit: int = 500) -> int:
    """Beat's periodic doorbell: enqueue every run that needs a worker now; returns how many."""
    try:
        close_old_connections()
        ids = runnable_ids(limit)
        for run_id in ids:
            advance_run.delay(run_id)
        stale_workers(max_silence_seconds=120)
    except Exception as exc:
        if not is_database_outage(exc):
            raise
        _outage.failed(exc)  # the next beat tick tries again
        return 0
    finally:
        _close_quietly()
    _outage.answered()
    return len(ids)


@shared_task(name="journal.integrations.tasks.purge", ignore_result=True)
def purge() -> int:
    """Beat's retention schedule: delete finished runs past their rule (journal.operations.retention)."""
    close_old_connections()
    try:
        return retention.purge()
    finally:
        close_old_connections()


@worker_shutting_down.connect
def _give_runs_back(**_kwargs) -> None:
    """Warm shutdown (SIGTERM): runs being driven are released at their next step boundary, so
    another worker continues them at once instead of after the lease expires."""
    if _worker is not None:
        _worker.request_stop()


@worker_init.connect
def _recover_at_start(**_kwargs) -> None:
    """A Celery worker that starts takes over at once the runs of this host's workers whose process is
    gone (``journal.driver.recovery``: pid and start time), and rings for them, as a restarted
    ``runworker`` does: without it they waited for their leases to expire (30 s by default) and for
    beat's next sweep. At ``worker_init``, before the consumer starts, so the messages are waiting for
    it (0.15 s sooner than at ``worker_ready``). A database that does not answer leaves it to the sweep."""
    try:
        if recovery.take_over_dead_local_workers(""):  # "": this process has no Worker row to spare yet
            sweep()  # rings for every runnable run: the freed ones among them
    except Exception as exc:
        if not is_database_outage(exc):
            raise
        _outage.failed(exc)
    finally:
        connections.close_all()  # the main process forks its pool next: no child inherits a connection
