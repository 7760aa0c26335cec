"""SQLite: this process's writers queue on a lock of their own (journal/store/sqlite_backend), not in
SQLite's sleeping busy handler; the lock goes with the transaction however it ends."""

import threading

import pytest
from django.db import connection, connections, transaction

import journal
from journal.driver import leases
from journal.models import Run
from journal.store import frozen, prepared
from journal.store.outage import is_database_outage
from journal.store.sqlite_backend import base as backend
from tests.agents import crashy  # noqa: F401 - registers "twelve"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite backend's writer queue")


def _in_thread(fn, errors: list) -> threading.Thread:
    def target():
        try:
            connections["default"].ensure_connection()
            connections["default"].queued.timeout = 5  # a lock left behind fails the test in seconds
            fn()
        except BaseException as exc:  # noqa: BLE001 - the test reads what each thread met
            errors.append(exc)
        finally:
            connections.close_all()
    thread = threading.Thread(target=target)
    thread.start()
    return thread


@pytest.fixture
def waits(monkeypatch) -> list:
    """Records each writer that found the lock taken and queued behind it."""
    queued: list = []
    acquire = backend._Queued.acquire

    def counting(self):
        if not self.lock.acquire(blocking=False):
            queued.append(threading.get_ident())
            return acquire(self)
        return None

    monkeypatch.setattr(backend._Queued, "acquire", counting)
    return queued


def test_a_writer_waits_in_this_process_for_the_transaction_before_it(waits):
    run_id = journal.start("twelve")
    inside, done, order, errors = threading.Event(), threading.Event(), [], []

    def holder():
        with transaction.atomic():
            Run.objects.filter(id=run_id).update(created_by="first")
            inside.set()
            done.wait(0.3)  # the other writer arrives meanwhile
            order.append("first committed")

    def follower():
        inside.wait(5)
        frozen.update(Run.objects, {"id": run_id}, {"created_by": "second"})  # an autocommit write
        order.append("second written")
        Run.objects.filter(id=run_id).update(progress={"done": 1})  # and one through Django's cursor

    threads = [_in_thread(holder, errors), _in_thread(follower, errors)]
    for t in threads:
        t.join(10)
    assert errors == [] and order == ["first committed", "second written"]
    assert len(waits) >= 1  # the follower queued on the lock, not in SQLite's busy handler
    run = Run.objects.get(id=run_id)
    assert (run.created_by, run.progress) == ("second", {"done": 1})


@pytest.mark.parametrize("end", ["rollback", "close"])
def test_the_lock_goes_with_a_transaction_that_rolls_back_or_whose_connection_closes(end):
    run_id = journal.start("twelve")
    errors: list = []

    def abandon():
        if end == "rollback":
            with pytest.raises(RuntimeError), transaction.atomic():
                Run.objects.filter(id=run_id).update(created_by="rolled back")
                raise RuntimeError("roll it back")
        else:
            transaction.atomic().__enter__()  # never exited: the connection closes under it
            Run.objects.filter(id=run_id).update(created_by="closed")
            connections["default"].close()

    first = _in_thread(abandon, errors)
    first.join(10)
    later = _in_thread(lambda: Run.objects.filter(id=run_id).update(created_by="later"), errors)
    later.join(10)
    assert errors == []
    assert Run.objects.get(id=run_id).created_by == "later"


def test_reads_take_no_lock():
    assert not backend.is_write("SELECT 1") and not backend.is_write("  select * from x")
    assert not backend.is_write("PRAGMA journal_mode")
    assert backend.is_write("INSERT INTO x VALUES (1)") and backend.is_write("BEGIN IMMEDIATE")


def test_a_writer_that_waits_past_the_timeout_meets_an_outage_not_a_failure():
    run_id = journal.start("twelve")
    inside, done, met = threading.Event(), threading.Event(), []

    def holder():
        with transaction.atomic():
            Run.objects.filter(id=run_id).update(created_by="holder")
            inside.set()
            done.wait(5)

    def late():
        inside.wait(5)
        connections["default"].queued.timeout = 0.2  # (_in_thread opened the connection)
        try:
            with transaction.atomic():  # its BEGIN waits for the holder's turn, then gives up
                Run.objects.filter(id=run_id).update(created_by="late")
        except Exception as exc:  # noqa: BLE001 - the test reads what the writer met
            met.append(exc)
        finally:
            done.set()

    errors: list = []
    threads = [_in_thread(holder, errors), _in_thread(late, errors)]
    for t in threads:
        t.join(10)
    assert errors == [] and len(met) == 1
    assert is_database_outage(met[0]) and "database is locked" in str(met[0])
    assert Run.objects.get(id=run_id).created_by == "holder"


def test_the_engines_own_transaction_is_all_or_none_and_lets_the_writers_turn_go(waits):
    run_id = journal.start("twelve")
    conn = connections["default"]
    with pytest.raises(RuntimeError), prepared.own_transaction():
        frozen.update(Run.objects, {"id": run_id}, {"created_by": "rolled back"})
        assert conn.connection.in_transaction and not conn.in_atomic_block  # bare: Django keeps no books
        raise RuntimeError("roll it back")
    assert Run.objects.get(id=run_id).created_by == ""
    assert not conn.connection.in_transaction and conn.get_autocommit()

    with prepared.own_transaction():
        frozen.update(Run.objects, {"id": run_id}, {"created_by": "committed"})
    errors: list = []
    other = _in_thread(lambda: Run.objects.filter(id=run_id).update(progress={"done": 1}), errors)
    other.join(10)  # the turn went with the COMMIT: another thread writes at once
    assert errors == [] and waits == []
    run = Run.objects.get(id=run_id)
    assert (run.created_by, run.progress) == ("committed", {"done": 1})


def test_the_engines_own_transaction_joins_a_callers_atomic_block():
    run_id = journal.start("twelve")
    with pytest.raises(RuntimeError), transaction.atomic():
        with prepared.own_transaction():  # a savepoint of the caller's transaction, not a BEGIN
            frozen.update(Run.objects, {"id": run_id}, {"created_by": "inner"})
        raise RuntimeError("the caller rolls back")
    assert Run.objects.get(id=run_id).created_by == ""


def _synchronous(conn) -> int:
    return conn.connection.execute("PRAGMA synchronous").fetchone()[0]


def test_a_claims_move_is_seen_at_once_and_the_connection_syncs_again_after_it():
    run_id = journal.start("twelve")
    assert _synchronous(connection) == 2  # the test database's FULL (settings' init_command)
    [claim] = leases.claim("w", 1, run_id=run_id)
    assert _synchronous(connection) == 2
    seen: list = []
    other = _in_thread(lambda: seen.append(Run.objects.values_list("status", "lease_owner").get(id=run_id)), seen)
    other.join(10)
    assert seen == [("running", "w")] and claim.epoch == 1  # committed (to the log) before claim returned


def test_the_setting_comes_back_when_the_write_inside_fails_and_a_transaction_keeps_its_own(monkeypatch):
    run_id = journal.start("twelve")
    monkeypatch.setattr(leases, "_take", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        leases.claim("w", 1, run_id=run_id)
    assert _synchronous(connection) == 2
    with transaction.atomic(), connection.synced_later():  # inside a transaction: not the write's to decide
        assert _synchronous(connection) == 2
    monkeypatch.setattr(connections["default"], "wal", False)
    with connection.synced_later():  # a rollback journal at NORMAL could be corrupted by a power cut
        assert _synchronous(connection) == 2
    monkeypatch.undo()
    with connection.synced_later():
        assert _synchronous(connection) == 1
    assert _synchronous(connection) == 2
