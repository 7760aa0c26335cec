"""Project wiring: settings, URLs, the Celery app. Holds no domain logic.

The Celery app is not imported when Django starts (Celery's Django recipe does): importing Celery
costs a process about 0.1 s, and only the distributed path needs it. ``celery -A durable_ui`` finds
the app in ``durable_ui.celery``; a process that sends messages imports it before its first one
(``DURABLE_CELERY_APP``, read by ``journal.integrations.bell``).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "celery_app":  # ``from durable_ui import celery_app`` still works, importing it then
        from durable_ui.celery import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
