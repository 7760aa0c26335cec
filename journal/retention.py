"""Retention: the only code allowed to delete from the append-only session log."""

from __future__ import annotations

import contextlib
import contextvars

_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar("journal_retention", default=False)


def retention_allowed() -> bool:
    return _allowed.get()


@contextlib.contextmanager
def allow_deletes():
    """Let this block delete session events (PostgreSQL: also tells the trigger, for this transaction)."""
    from django.db import connection

    token = _allowed.set(True)
    try:
        if connection.vendor == "postgresql" and connection.in_atomic_block:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL durable.retention = 'on'")
        yield
    finally:
        _allowed.reset(token)
