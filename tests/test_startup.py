"""What a process pays before it can resume a run: a restarted worker's start is most of the time
from a crash to the run going on (bench/restart_recovery.py), so the default path imports nothing
it does not use: Celery (the distributed path), psycopg (PostgreSQL), django-ninja and pydantic (the
HTTP API) were imported by every process at start-up, 0.2-0.3 s of a SQLite worker's 0.6-0.75 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import django
django.setup()
from journal.driver.worker import EmbeddedWorker  # what runworker imports
print(json.dumps(sorted(m for m in ("celery", "kombu", "psycopg", "ninja", "pydantic") if m in sys.modules)))
"""


def test_a_sqlite_worker_starts_without_celery_psycopg_or_the_api(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "durable_ui.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    env.pop("DURABLE_CELERY", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_the_celery_app_is_found_where_celery_looks_for_it():
    """``celery -A durable_ui`` (its find_app) and ``from durable_ui import celery_app`` still reach the app."""
    from celery.app.utils import find_app

    import durable_ui

    app = find_app("durable_ui")
    assert app.main == "durable_ui"
    assert durable_ui.celery_app is app
