"""Dispatch: ring the doorbell for a run that became runnable.

The embedded worker polls the database, so it needs no doorbell. With DURABLE_CELERY on, a
Celery message carrying only the run id is sent after the transaction commits; the worker that
receives it still has to win the database lease, so duplicates are harmless.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction


def notify(run_id) -> None:
    if not getattr(settings, "DURABLE_CELERY", False):
        return
    run_id = str(run_id)

    def send() -> None:
        from journal.tasks import advance_run

        advance_run.delay(run_id)

    transaction.on_commit(send)


def after_suspend(ctx, waiting_for: dict, final: list) -> None:
    """Called inside the suspension's transaction; children and approvals hook in here."""
