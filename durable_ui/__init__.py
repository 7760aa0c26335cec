"""Project wiring: settings, URLs, the Celery app. Holds no domain logic."""

# Load the Celery app whenever Django starts, so @shared_task uses it (Celery's Django recipe).
from durable_ui.celery import app as celery_app

__all__ = ("celery_app",)
