"""The doorbell's Celery backend, with Celery imported on the first ring that needs it.

A process on the embedded path (the default) never sends a message, so it never pays Celery's
import (about 0.1 s of every worker's start, which is most of what a restarted worker spends
before it resumes a run). ``DURABLE_CELERY_APP`` names the module holding the project's Celery app:
it is imported before the tasks, so that their messages go through its broker, not Celery's default.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from django.conf import settings


def prepare() -> None:
    """At start-up: a process started with ``DURABLE_CELERY`` on imports the app and the tasks now, not
    in the request that rings first."""
    if getattr(settings, "DURABLE_CELERY", False):
        _tasks()


def ring(run_id: str) -> None:
    """One message per wake-up when ``DURABLE_CELERY`` is on (read at each ring: turning it on or off
    needs no restart of the seam)."""
    if getattr(settings, "DURABLE_CELERY", False):
        _tasks().advance_run.delay(run_id)


@functools.cache
def _tasks() -> ModuleType:
    app_module = getattr(settings, "DURABLE_CELERY_APP", "")
    if app_module:
        importlib.import_module(app_module)
    return importlib.import_module("journal.integrations.tasks")
