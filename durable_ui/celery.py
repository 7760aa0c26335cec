"""The Celery app for the distributed path: ``celery -A durable_ui worker`` and ``celery -A durable_ui beat``.

Celery is only a doorbell here: a message carries a run id, and the worker that receives it
must still win the run's database lease (journal.integrations.tasks.advance_run). Beat runs the sweeper,
which re-rings for anything runnable (due timers, expired leases, missed messages), so a lost
or duplicated message costs latency, never correctness. The embedded worker needs none of this.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")

app = Celery("durable_ui")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["journal.integrations"])  # journal/integrations/tasks.py

SWEEP_SECONDS = float(os.environ.get("DURABLE_SWEEP_SECONDS", "5"))
app.conf.beat_schedule = {
    "durable-sweep": {"task": "journal.integrations.tasks.sweep", "schedule": SWEEP_SECONDS},
    "durable-retention": {"task": "journal.integrations.tasks.purge",
                          "schedule": float(os.environ.get("DURABLE_RETENTION_INTERVAL", "3600"))},
}
app.conf.broker_connection_retry_on_startup = True
