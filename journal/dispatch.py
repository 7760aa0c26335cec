"""Dispatch: ring the doorbell for a run that became runnable, and wake runs that wait on others.

The embedded worker polls the database, so it needs no doorbell. With DURABLE_CELERY on, a
Celery message carrying only the run id is sent after the transaction commits; the worker that
receives it still has to win the database lease, so duplicates are harmless.

The hooks here run inside the executor's transactions, so "the child finished" and "the parent
may continue" (or "the approval was decided before the run finished suspending") commit
together: there is no window in which a wake-up can be lost.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction


def notify(run_id) -> None:
    if not getattr(settings, "DURABLE_CELERY", False):
        return
    run_id = str(run_id)

    def send() -> None:
        from journal.tasks import advance_run

        advance_run.delay(run_id)

    transaction.on_commit(send)


def lock_for_wake(run_id) -> None:
    """Lock the run's row before deciding whether to wake it (call inside the waking transaction).

    Without it, on PostgreSQL (READ COMMITTED) a wake-up can be lost: the waker's conditional
    UPDATE sees the run still running and matches nothing, while the run's suspension
    transaction checks the inbox (or the child, or the approval) before the waker commits.
    Holding the row lock orders the two: either the suspension commits first and the waker
    sees "suspended", or the waker commits first and the suspension's check sees its row.
    SQLite's IMMEDIATE transactions already serialize writers.
    """
    if connection.vendor == "postgresql":
        from journal.models import Run

        list(Run.objects.select_for_update().filter(id=run_id).values_list("id", flat=True))


def after_suspend(ctx, waiting_for: dict, final: list) -> None:
    """Called inside the suspension's transaction; a wake-up that raced the suspension sets final[0]."""
    kind = waiting_for.get("kind")
    if kind == "approval":
        from journal.approvals import after_suspend as approval_after_suspend

        approval_after_suspend(ctx, waiting_for, final)
    elif kind == "child":
        from journal.children import after_suspend as child_after_suspend

        child_after_suspend(ctx, waiting_for, final)


def after_settle(ctx, status: str) -> None:
    """Called inside the transaction that finishes a run: a child's end wakes its waiting parent."""
    if ctx.run.parent_id is not None:
        from journal.children import wake_parent

        wake_parent(ctx.run.parent_id)
