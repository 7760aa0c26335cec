"""The doorbell: tell whoever drives runs that one became runnable.

The embedded worker polls the database, so by default the bell rings nowhere. With
``DURABLE_CELERY`` on, the Celery integration plugs in a backend at start-up
(``journal.integrations.tasks``) that sends a message carrying only the run id, after the
transaction commits; the worker that receives it still has to win the database lease, so
duplicates are harmless. A seam, so the store never imports the floors that drive runs.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

_backend: Callable[[str], None] | None = None


def set_backend(backend: Callable[[str], None] | None) -> None:
    """Install (or remove, with None) what ``notify`` calls after commit with the run id."""
    global _backend
    _backend = backend


def notify(run_id) -> None:
    backend = _backend
    if backend is None:
        return
    run_id = str(run_id)
    transaction.on_commit(lambda: backend(run_id))
