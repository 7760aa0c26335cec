"""Project wiring: settings, URLs, the Celery app. Holds no domain logic."""
