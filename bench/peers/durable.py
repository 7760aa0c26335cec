"""durable-ui through its public API: ``@journal.workflow``, ``@journal.step``, ``journal.start`` and
``journal.wait``, driven by an embedded worker (the same one ``manage.py runworker`` runs).

Django is configured here, in the child process, for the store the bench hands over (DATABASE_URL),
and migrated; the workflows are declared after ``django.setup()`` (the decorators register with an
engine that imports its models). A run's time includes its start and the worker's claim of it.

The worker keeps running between runs, as a deployed one does (the peers keep their connection pools
and compiled graphs the same way): a worker made anew for every call spent ~40 ms registering,
opening its threads' connections and noticing it was idle, which the 500-step run's per-step figure
carried as 80 µs a step. ``prepare`` makes one with the workload's number of slots, outside the timing.
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


class Durable:
    name = "durable-ui"
    modes = ("sync", "async", "exit")

    def __init__(self, store: Store) -> None:
        _setup(store)
        self._worker = None
        self._thread: threading.Thread | None = None
        self._slots = 0

    def prepare(self, concurrency: int) -> None:
        """A running worker with ``concurrency`` slots, each slot's thread with its connection open."""
        if self._slots == concurrency:
            return
        self._stop()
        from journal.driver.worker import EmbeddedWorker

        self._worker = EmbeddedWorker(concurrency=concurrency, poll_interval=0.005)
        self._thread = threading.Thread(target=self._worker.run, name="bench-worker", daemon=True)
        self._thread.start()
        self._slots = concurrency
        self._wait_all(self._start("peers-sync", 2 * concurrency, 0))  # every slot's thread made and connected

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.request_stop()
            self._thread.join(timeout=60)
            self._worker = self._thread = None
            self._slots = 0

    @staticmethod
    def _start(workflow: str, count: int, *args) -> list[str]:
        import journal

        return [journal.start(workflow, *args) for _ in range(count)]

    @staticmethod
    def _wait_all(ids: list[str]) -> None:
        import journal

        for run_id in ids:
            run = journal.wait(run_id, timeout=600)
            assert run.status == "completed", (run.status, run.error)

    def _runs(self, workflow: str, count: int, concurrency: int, *args) -> None:
        self.prepare(concurrency)
        self._wait_all(self._start(workflow, count, *args))

    def one_run(self, steps: int, mode: str = "sync") -> None:
        self._runs(f"peers-{mode}", 1, 1, steps)

    def many_runs(self, runs: int, steps: int, concurrency: int) -> None:
        self._runs("peers-sync", runs, concurrency, steps)

    def conversation(self, messages: int, base: int = 0) -> None:
        self._runs("peers-conversation", 1, 1, messages, base)

    def close(self) -> None:
        from django.db import connections

        self._stop()
        connections.close_all()


def open_system(store: Store) -> Durable:
    return Durable(store)


def crash(store: Store, log: Path, *, resume: bool, effects: bool = False) -> None:
    """First process: start the run and drive it with a worker until killed. Second process: a new
    worker on the same host (it registers, finds the dead worker's pid gone and takes its runs, as
    ``runworker`` does), until the run is done. ``effects``: its steps are effects (``effect=True``)."""
    os.environ["PEERS_CRASH_LOG"] = str(log)
    os.environ.setdefault("DURABLE_LEASE_SECONDS", "30")
    _setup(store, migrate=not resume)
    import journal
    from journal.driver.worker import EmbeddedWorker
    from journal.models import Run

    if not resume:
        journal.start("peers-crash-effects" if effects else "peers-crash", CRASH_STEPS)
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
