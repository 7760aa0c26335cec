"""Bulk actions on every run matching a search, in the background (``runs.models.BulkJob``).

A job walks the matching runs in batches, in (created_at, id) order, and for each asks the engine
first whether the run's state allows the action (``refusal``): a run that refuses is counted and
listed, never shown as an error. Each action taken is audited like one taken by hand. The walk is
done by a thread of the web process; its row holds the cursor and a heartbeat, so a job whose
thread died (a web restart) is picked up again by the next look at its progress (``ensure_running``).
No broker is needed.
"""

from __future__ import annotations

import logging
import secrets
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connections, transaction
from django.db.models import Q
from django.http import QueryDict
from django.utils import timezone

import journal
from journal.models import TERMINAL_STATUSES, Run
from journal.operations.runs import refusal
from runs import queries
from runs.models import AuditEntry, BulkJob, BulkJobStatus

log = logging.getLogger(__name__)

BATCH = 200
SAVE_EVERY = 20
STALE = timedelta(seconds=15)  # a job whose heartbeat is older has lost its thread
REFUSALS_LISTED = 500
FAILURES_LISTED = 200
ACTIONS = ("cancel", "retry", "compensate", "pause", "resume")


def call(action: str, run_id: uuid.UUID, actor: str, reason: str) -> Any:
    if action == "cancel":
        return journal.cancel(run_id, reason or "bulk cancel from the dashboard", actor=actor)
    if action == "retry":
        return journal.retry(run_id, actor=actor, reason=reason)
    if action == "compensate":
        return journal.compensate(run_id, actor=actor, reason=reason)
    if action == "pause":
        return journal.pause(run_id, actor=actor, reason=reason)
    return journal.resume(run_id, actor=actor, reason=reason)


def params_of(post: QueryDict) -> dict[str, list[str]]:
    return {k: post.getlist(k) for k in ("q", "status", "agent", "version", "since", "until") if post.getlist(k)}


def _filter(job: BulkJob) -> queries.RunFilter:
    params = QueryDict(mutable=True)
    for key, values in job.params.items():
        params.setlist(key, values)
    return queries.RunFilter.from_query(params)


def create_job(*, actor: str, action: str, reason: str, params: dict[str, list[str]], total: int,
               start: bool = True) -> BulkJob:
    """Record the job (the count the operator confirmed) and start its thread once the row is committed."""
    job = BulkJob.objects.create(actor=actor, action=action, reason=reason, params=params, total=total,
                                 search=" ".join(params.get("q", []))[:300])
    if start:
        transaction.on_commit(lambda: ensure_running(job.id))
    return job


def ensure_running(job_id: uuid.UUID) -> bool:
    """Start a thread for the job unless one is alive (its heartbeat is fresh); True when one started."""
    token = secrets.token_hex(8)
    now = timezone.now()
    took = BulkJob.objects.filter(
        Q(heartbeat__isnull=True) | Q(heartbeat__lt=now - STALE), id=job_id,
        status__in=[BulkJobStatus.QUEUED, BulkJobStatus.RUNNING],
    ).update(owner=token, heartbeat=now, status=BulkJobStatus.RUNNING) == 1
    if took:
        threading.Thread(target=_work, args=(job_id, token), name=f"bulk-{job_id}", daemon=True).start()
    return took


def _work(job_id: uuid.UUID, token: str) -> None:
    close_old_connections()
    try:
        while process_batch(job_id, token):
            pass
    except Exception as exc:
        if journal.is_database_outage(exc):  # not the job's fault: its heartbeat goes stale and a later look resumes it
            log.warning("bulk job %s paused by a database outage: %s", job_id, exc)
            return
        log.exception("bulk job %s failed", job_id)  # the job's own fault, not a run's: say so on its page
        BulkJob.objects.filter(id=job_id, owner=token).update(
            status=BulkJobStatus.BROKEN, message=f"{type(exc).__name__}: {exc}"[:2000], finished_at=timezone.now())
    finally:
        connections.close_all()


def process_batch(job_id: uuid.UUID, token: str, size: int = BATCH) -> bool:
    """Act on the next batch of matching runs; False when the job is finished (or no longer ours)."""
    job = BulkJob.objects.filter(id=job_id, owner=token).first()
    if job is None or job.finished:
        return False
    f = _filter(job)
    qs = f.apply(Run.objects.filter(created_at__lte=job.created_at)).only("id", "status", "paused", "created_at")
    if job.cursor_created is not None:
        qs = qs.filter(Q(created_at__gt=job.cursor_created) | Q(created_at=job.cursor_created, id__gt=job.cursor_id))
    runs = list(qs.order_by("created_at", "id")[:size])
    for i, run in enumerate(runs, 1):
        _act(job, run)
        job.cursor_created, job.cursor_id = run.created_at, run.id
        # Saved every few runs, not once a batch: the page's counts move, the heartbeat stays fresh however
        # slow the actions are, and a thread that dies repeats at most SAVE_EVERY runs' actions (each is
        # then refused by the state it left, not done twice).
        if i % SAVE_EVERY == 0 and not _save(job, token):
            return False
    if len(runs) < size:
        job.status, job.finished_at = BulkJobStatus.FINISHED, timezone.now()
    return _save(job, token) and not job.finished


def _save(job: BulkJob, token: str) -> bool:
    """Write the job's counts and cursor; False when another thread has taken the job over."""
    job.heartbeat = timezone.now()
    fields = ["done", "requested", "refused", "failed", "refusals", "refused_by_reason", "failures", "heartbeat",
              "cursor_created", "cursor_id", "status", "finished_at"]
    return BulkJob.objects.filter(id=job.id, owner=token).update(**{name: getattr(job, name) for name in fields}) == 1


def _act(job: BulkJob, run: Run) -> None:
    why = refusal(run, job.action)
    if why:
        why = why.removeprefix("it is ")
        job.refused += 1
        job.refused_by_reason[why] = job.refused_by_reason.get(why, 0) + 1
        if len(job.refusals) < REFUSALS_LISTED:
            job.refusals.append([str(run.id), why])
        return
    ok, message, value = _perform(job.action, lambda: call(job.action, run.id, job.actor, job.reason))
    AuditEntry.objects.create(actor=job.actor, action=job.action, run_id=run.id, target=f"bulk job {job.id}",
                              comment=job.reason, ok=ok, result=message[:4000])
    if not ok:
        job.failed += 1
        if len(job.failures) < FAILURES_LISTED:
            job.failures.append([str(run.id), message[:300]])
    elif job.action == "cancel" and getattr(value, "status", None) not in TERMINAL_STATUSES:
        job.requested += 1  # a worker holds it: it stops at its next step boundary
    else:
        job.done += 1


def _perform(action: str, call: Callable[[], Any]) -> tuple[bool, str, Any]:
    try:
        value = call()
    except journal.DurableError as exc:  # the state changed since the check (a race): the engine's answer
        return False, str(exc), None
    return True, f"{action}: done", value
