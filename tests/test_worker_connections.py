"""The worker's threads keep their database connections from run to run (opening one cost more than a
short run), close them at shutdown, and recover when the server ended one between runs."""

import subprocess
import threading

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

import journal
from journal.driver.worker import EmbeddedWorker
from journal.models import Run, RunStatus
from journal.store.thread_connections import close_at_thread_exit
from tests.agents import crashy  # noqa: F401 - registers "twelve"
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def opened():
    """Connections opened, by thread name."""
    seen: list[str] = []

    def count(sender, connection, **kwargs):
        seen.append(threading.current_thread().name)

    connection_created.connect(count)
    yield seen
    connection_created.disconnect(count)


def test_twenty_runs_on_two_slots_open_a_handful_of_connections_not_two_per_run(opened):
    ids = [journal.start("twelve", 3, 0) for _ in range(20)]
    worker = EmbeddedWorker(concurrency=2, poll_interval=0.01)
    worker.run(until_idle=True, max_seconds=120)
    assert all(r.status == RunStatus.COMPLETED for r in Run.objects.filter(id__in=ids))
    pool = [name for name in opened if name.startswith("durable-run")]
    assert len(pool) <= 2, opened  # one per pool thread; it was two per run (40 here)
    assert len(opened) <= 6, opened  # and the claim loop and the heartbeat keep theirs too
    assert not worker._drivers  # the pool's connections were closed at shutdown


@pytest.mark.postgres
def test_a_connection_the_server_ended_between_runs_costs_a_retry_not_a_run():
    worker = EmbeddedWorker(concurrency=1, poll_interval=0.01)
    first = journal.start("twelve", 2, 0)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        journal.wait(first, timeout=60)
        # End every other session to this database (the pool thread's kept connection among them),
        # as a server restart or an idle timeout would.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        second = journal.start("twelve", 2, 0)
        run = journal.wait(second, timeout=60)
        assert run.status == RunStatus.COMPLETED, run.error
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()


_held = threading.Event()
_raw: dict[str, object] = {}  # run name -> the driver connection its pool thread used


@journal.step()
def note_connection(name: str) -> str:
    connection.ensure_connection()
    _raw[name] = connection.connection
    return name


@journal.step()
def hold() -> None:
    _held.wait(60)


@journal.workflow(name="conn-quick")
def conn_quick(ctx) -> str:
    return note_connection("quick")


@journal.workflow(name="conn-held")
def conn_held(ctx) -> str:
    note_connection("held")
    hold()
    return "held"


def _closed(raw) -> bool:
    if hasattr(raw, "closed"):  # psycopg
        return bool(raw.closed)
    try:  # sqlite3
        raw.execute("SELECT 1")
    except Exception:
        return True
    return False


def test_a_pool_shut_down_while_a_run_is_driven_closes_its_idle_threads_connections():
    """The idle threads cannot be asked to close (one is busy, and the pool is not waited for): each
    closes its connection as it ends. Before, the connection stayed open until garbage collection."""
    _held.clear()
    _raw.clear()
    worker = EmbeddedWorker(concurrency=2, poll_interval=0.01)
    worker.register()
    try:
        # The held run first, in its step before the quick one is claimed: claimed together, a loaded
        # machine could start the second pool thread after the first had finished the quick run and
        # taken the held one too, and the quick run's connection would then belong to the busy thread.
        held = journal.start("conn-held")
        assert worker.tick() == 1
        wait_for(lambda: "held" in _raw, message="the held run's step")
        quick = journal.start("conn-quick")
        assert worker.tick() == 1
        assert journal.wait(quick, timeout=60).status == RunStatus.COMPLETED
        assert _raw["quick"] is not _raw["held"]
        assert len(worker._active) == 1
    finally:
        worker.shutdown(grace=0.2)  # the held run is still in its step
    try:
        wait_for(lambda: _closed(_raw["quick"]), timeout=10, message="the idle thread's connection closed")
    finally:
        _held.set()
    wait_for(lambda: _closed(_raw["held"]), timeout=30, message="the busy thread's connection closed")
    assert journal.get_run(held).status != RunStatus.FAILED  # given back at its next step boundary


def test_a_command_forked_beside_a_thread_with_a_closer_leaves_that_threads_connection_alone():
    """A child forked with a preexec_fn (the sandbox's commands) clears the other threads' locals;
    their closers must not close the parent's connections there (on PostgreSQL that ended the
    parent's session on the shared socket; on SQLite the child could hang on a lock)."""
    ready, done, answers = threading.Event(), threading.Event(), []

    def holder() -> None:
        close_at_thread_exit()
        answers.append(Run.objects.count())
        ready.set()
        done.wait(60)
        answers.append(Run.objects.count())  # the same connection, after the fork

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert ready.wait(30)
        child = subprocess.run(["true"], preexec_fn=lambda: None, timeout=30)
        assert child.returncode == 0
    finally:
        done.set()
        thread.join(30)
    assert answers == [answers[0], answers[0]]
