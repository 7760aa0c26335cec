"""The doorbells: an embedded worker claims a run started in its process at once, not at its next poll,
and ``journal.wait`` reads a run again as soon as a worker of its process stops driving it; on
PostgreSQL a worker in another process hears the start's NOTIFY."""

import threading
import time
import uuid

import pytest
from django.db import transaction

import journal
from journal.driver.worker import EmbeddedWorker
from journal.engine.launch import start_run
from journal.models import Run, RunStatus
from journal.store import doorbell
from tests.agents import crashy  # noqa: F401 - registers "twelve", which the worker process imports too

pytestmark = pytest.mark.django_db(transaction=True)

NEVER = 600.0  # a poll interval no test outlives: whatever runs, the bell made it run


@journal.workflow(name="bell_quick")
def bell_quick(ctx, n: int) -> int:
    return n + 1


@pytest.fixture
def listening_worker():
    """An embedded worker that polls once, at start, and then only when a bell rings."""
    worker = EmbeddedWorker(concurrency=2, poll_interval=NEVER)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while worker._wake.set not in doorbell._listeners and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker._wake.set in doorbell._listeners
    yield worker
    worker.request_stop()
    thread.join(30)
    assert not thread.is_alive()
    assert worker._wake.set not in doorbell._listeners  # a stopped worker no longer listens


def test_a_run_started_in_the_process_is_claimed_without_waiting_for_the_poll(listening_worker):
    time.sleep(0.2)  # the worker's first claim found nothing: it now sleeps for NEVER seconds
    ids = [journal.start("bell_quick", i) for i in range(3)]
    for i, run_id in enumerate(ids):
        run = journal.wait(run_id, timeout=30)
        assert run.status == RunStatus.COMPLETED, run.status
        assert run.output == i + 1


def test_the_bell_rings_after_the_commit_not_before(listening_worker):
    time.sleep(0.2)
    rung = []
    doorbell.listen(lambda: rung.append(Run.objects.count()))
    try:
        with transaction.atomic():
            run_id = journal.start("bell_quick", 1)
            assert rung == []  # inside the transaction nobody is told: the row is not visible yet
        assert rung == [1]
    finally:
        doorbell._listeners.pop()
    assert journal.wait(run_id, timeout=30).status == RunStatus.COMPLETED


def test_a_worker_rings_the_stopped_bell_when_its_drive_ends(listening_worker):
    run_id = uuid.uuid4()
    with doorbell.watch(run_id) as ended:  # watched before the run exists: nothing can be missed
        start_run("bell_quick", (5,), run_id=run_id)
        assert ended.wait(30), "the worker drove the run but did not ring"
    assert Run.objects.get(id=run_id).status == RunStatus.COMPLETED
    assert str(run_id) not in doorbell._watchers  # the watch is gone with its block


def test_watchers_of_one_run_are_all_woken_and_others_are_not():
    with doorbell.watch("a") as first, doorbell.watch("a") as second, doorbell.watch("b") as other:
        doorbell.stopped("a")
        assert first.is_set() and second.is_set()
        assert not other.is_set()
    assert doorbell._watchers == {}
    doorbell.stopped("a")  # nobody watches: nothing to do, nothing kept
    assert doorbell._watchers == {}


@pytest.mark.postgres
def test_a_worker_in_another_process_hears_a_start_through_the_database(worker_env, spawn_worker):
    worker = spawn_worker(worker_env("tests.agents.crashy"), "--poll", str(NEVER))
    deadline = time.monotonic() + 60
    while "concurrency" not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # its first claim found nothing: it now sleeps for NEVER seconds unless it hears the bell
    for _ in range(2):
        run = journal.wait(journal.start("twelve", 2, 0), timeout=60)
        assert run.status == RunStatus.COMPLETED, (run.status, worker.log()[-2000:])
    assert worker.terminate() == 0


@pytest.mark.postgres
def test_a_start_inside_a_transaction_that_rolls_back_rings_nobody():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {doorbell.CHANNEL}")
    raw = connection.connection
    list(raw.notifies(timeout=0.1))  # nothing pending from before
    with pytest.raises(RuntimeError), transaction.atomic():
        journal.start("bell_quick", 1)
        raise RuntimeError("roll back")
    assert list(raw.notifies(timeout=0.3)) == []
    run_id = journal.start("bell_quick", 2)
    assert [n.payload for n in raw.notifies(timeout=5, stop_after=1)] == [run_id]
    with connection.cursor() as cursor:
        cursor.execute(f"UNLISTEN {doorbell.CHANNEL}")


@pytest.mark.postgres
def test_a_bell_that_cannot_be_sent_fails_only_the_transaction_it_belongs_to(monkeypatch):
    from django.db import OperationalError
    from django.db.backends import utils

    real = utils.CursorWrapper.execute

    def no_notify(self, sql, params=None):
        if "pg_notify" in sql:
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, sql, params)

    monkeypatch.setattr(utils.CursorWrapper, "execute", no_notify)
    doorbell.notify(uuid.uuid4())  # after the change committed: the poll will find the run; no error
    with pytest.raises(OperationalError), transaction.atomic():
        doorbell.notify(uuid.uuid4())  # inside: the transaction is broken, and says so
