"""The worker's threads keep their database connections from run to run (opening one cost more than a
short run), close them at shutdown, and recover when the server ended one between runs."""

import threading

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

import journal
from journal.driver.worker import EmbeddedWorker
from journal.models import Run, RunStatus
from tests.agents import crashy  # noqa: F401 - registers "twelve"

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
