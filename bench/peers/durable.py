"""durable-ui through its public API: ``@journal.workflow``, ``@journal.step``, ``journal.start`` and
``journal.wait``, driven by an embedded worker (the same one ``manage.py runworker`` runs).

Django is configured here, in the child process, for the store the bench hands over (DATABASE_URL),
and migrated; the workflows are declared after ``django.setup()`` (the decorators register with an
engine that imports its models). A run's time includes its start and the worker's claim of it.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import threading
import time
from pathlib import Path

import django

from .databases import Store
from .workloads import CRASH_STEPS


def _setup(store: Store, *, migrate: bool = True) -> None:
    os.environ["DATABASE_URL"] = store.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
    os.environ.setdefault("DURABLE_LOG_LEVEL", "WARNING")
    os.environ.setdefault("DURABLE_SANDBOX_ROOT", tempfile.mkdtemp(prefix="peers-sandboxes-"))
    django.setup()
    from django.core.management import call_command

    if migrate:  # a restarted worker finds the schema in place (as runworker does)
        call_command("migrate", verbosity=0)
    importlib.import_module("bench.peers.durable_agents")  # the workflows, once Django is set up


def _drive(concurrency: int) -> None:
    from journal.driver.worker import EmbeddedWorker

    EmbeddedWorker(concurrency=concurrency, poll_interval=0.005).run(until_idle=True, max_seconds=3600)


class Durable:
    name = "durable-ui"
    modes = ("sync", "async", "exit")

    def __init__(self, store: Store) -> None:
        _setup(store)

    def _runs(self, workflow: str, count: int, concurrency: int, *args) -> None:
        import journal

        ids = [journal.start(workflow, *args) for _ in range(count)]
        _drive(concurrency)
        for run_id in ids:
            run = journal.wait(run_id, timeout=5)
            assert run.status == "completed", (run.status, run.error)

    def one_run(self, steps: int, mode: str = "sync") -> None:
        self._runs(f"peers-{mode}", 1, 1, steps)

    def many_runs(self, runs: int, steps: int, concurrency: int) -> None:
        self._runs("peers-sync", runs, concurrency, steps)

    def conversation(self, messages: int, base: int = 0) -> None:
        self._runs("peers-conversation", 1, 1, messages, base)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


def open_system(store: Store) -> Durable:
    return Durable(store)


def crash(store: Store, log: Path, *, resume: bool) -> None:
    """First process: start the run and drive it with a worker until killed. Second process: a new
    worker on the same host (it registers, finds the dead worker's pid gone and takes its runs, as
    ``runworker`` does), until the run is done."""
    os.environ["PEERS_CRASH_LOG"] = str(log)
    os.environ.setdefault("DURABLE_LEASE_SECONDS", "30")
    _setup(store, migrate=not resume)
    import journal
    from journal.driver.worker import EmbeddedWorker
    from journal.models import Run

    if not resume:
        journal.start("peers-crash", CRASH_STEPS)
        EmbeddedWorker(concurrency=1, poll_interval=0.05).run()
        return
    worker = EmbeddedWorker(concurrency=1, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    run = Run.objects.get()
    while Run.objects.get(id=run.id).status != "completed":
        time.sleep(0.01)
    worker.request_stop()
    thread.join(timeout=30)
