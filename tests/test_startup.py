"""What a process pays before it can resume a run: a restarted worker's start is most of the time
from a crash to the run going on (bench/restart_recovery.py), so the default path imports nothing
it does not use: Celery (the distributed path), psycopg (PostgreSQL), django-ninja and pydantic (the
HTTP API) were imported by every process at start-up, 0.2-0.3 s of a SQLite worker's 0.6-0.75 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = """
import json, sys
import django
django.setup()
from journal.driver.worker import EmbeddedWorker  # what runworker imports
print(json.dumps(sorted(m for m in ("celery", "kombu", "psycopg", "ninja", "pydantic") if m in sys.modules)))
"""


def _imported_at_start(tmp_path, **env_vars: str) -> list[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "durable_ui.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", **env_vars}
    if "DURABLE_CELERY" not in env_vars:
        env.pop("DURABLE_CELERY", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_sqlite_worker_starts_without_celery_psycopg_or_the_api(tmp_path):
    assert _imported_at_start(tmp_path) == []


def test_a_process_with_celery_switched_on_imports_it_at_start_not_at_its_first_ring(tmp_path):
    assert {"celery", "kombu"} <= set(_imported_at_start(tmp_path, DURABLE_CELERY="1"))


@pytest.mark.django_db
def test_a_postgresql_connection_widens_psycopgs_parse_cache():
    """The start's one statement has 54 parameters; psycopg caches the parse of at most 50 unless told."""
    from django.db import connection

    from journal.store import prepared

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (make test-postgres)")
    connection.ensure_connection()
    import psycopg._queries

    assert psycopg._queries.MAX_CACHED_STATEMENT_PARAMS >= prepared.CACHED_PARAMS


def test_the_celery_app_is_found_where_celery_looks_for_it():
    """``celery -A durable_ui`` (its find_app) and ``from durable_ui import celery_app`` still reach the app."""
    from celery.app.utils import find_app

    import durable_ui

    app = find_app("durable_ui")
    assert app.main == "durable_ui"
    assert durable_ui.celery_app is app
