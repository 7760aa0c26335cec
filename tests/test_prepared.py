"""The journal's append as a prepared statement on PostgreSQL (journal/store/prepared.py): prepared once
per connection, off with DURABLE_PG_PREPARE=0, errors still Django's (so an outage is still an outage),
still in Django's query log; SQLite goes through Django's cursor as before."""

import uuid

import pytest
from django.db import connection, transaction
from django.db.utils import OperationalError, ProgrammingError
from django.test.utils import CaptureQueriesContext

import journal
from journal.driver import leases
from journal.models import EventKind, Run, SessionEvent
from journal.store import outage, prepared
from journal.store.writer import JournalWriter
from tests.agents import crashy  # noqa: F401 - registers "twelve"

pytestmark = pytest.mark.django_db(transaction=True)


def _append_three() -> str:
    [claim] = leases.claim("w", 1, run_id=journal.start("twelve"))
    writer = JournalWriter(claim.run_id, claim.epoch, next_seq=3)
    for i in range(3):
        writer.record(EventKind.LOG, {"message": f"line {i}"})
    assert SessionEvent.objects.filter(run_id=claim.run_id, kind=EventKind.LOG).count() == 3
    return str(claim.run_id)


def _prepared_appends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements "
                       "WHERE statement LIKE 'INSERT INTO journal_sessionevent%%'")
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_the_append_is_prepared_once_per_connection_and_logged_like_any_query():
    connection.close()  # a fresh connection: nothing prepared on it yet
    with CaptureQueriesContext(connection) as queries:
        _append_three()
    assert _prepared_appends() == 1  # three appends, one statement, planned once
    appends = [q["sql"] for q in queries.captured_queries if "INSERT INTO journal_sessionevent" in q["sql"]]
    assert len(appends) >= 3 and all("-- libpq" in sql for sql in appends[-3:])  # prepared, through wire.py


@pytest.mark.postgres
def test_with_preparing_off_nothing_is_prepared(monkeypatch):
    monkeypatch.setenv("DURABLE_PG_PREPARE", "0")
    connection.close()
    _append_three()
    assert _prepared_appends() == 0


@pytest.mark.postgres
def test_errors_through_the_prepared_cursor_are_djangos_and_an_outage_is_an_outage():
    with pytest.raises(ProgrammingError), prepared.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM journal_run WHERE id = %s", [1])
    connection.close()
    with connection.cursor() as cursor:  # another session ends this one, as a server restart would
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    from django.db import connections

    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    with pytest.raises(OperationalError) as caught, prepared.cursor() as cursor:
        cursor.execute("SELECT 1 FROM journal_run WHERE id = %s", ["00000000-0000-0000-0000-000000000000"])
    assert outage.is_database_outage(caught.value)
    connection.close()


def test_on_sqlite_the_append_uses_sqlites_own_cursor_kept_for_the_connection_and_logged():
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite path")
    assert not prepared.enabled()
    with CaptureQueriesContext(connection) as queries:
        run_id = _append_three()
    assert SessionEvent.objects.filter(run_id=run_id).count() == 4  # run_started and the three
    appends = [q["sql"] for q in queries.captured_queries if "INSERT INTO journal_sessionevent" in q["sql"]]
    assert len(appends) >= 3
    with prepared.cursor() as first, prepared.cursor() as second:
        assert first is second  # one cursor for the connection's life
    with pytest.raises(OperationalError), prepared.cursor() as cursor:  # Django's class, not sqlite3's
        cursor.execute("SELECT no_such_column FROM journal_run WHERE id = %s", [1])


def test_on_sqlite_a_write_returning_rows_is_finished_when_execute_returns():
    """sqlite3 leaves a statement with RETURNING unfinished until its last row is read, and an
    unfinished statement keeps its connection from committing ("SQL statements in progress"): the
    kept cursor reads such a write's rows at once (the group commit's insert returns its runs)."""
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite path")
    run_id = journal.start("twelve")
    with prepared.cursor() as cursor:
        cursor.execute("UPDATE journal_run SET steps = steps + 1 WHERE id IN (%s, %s) RETURNING steps",
                       [uuid.UUID(run_id).hex, uuid.UUID(journal.start("twelve")).hex])
        assert cursor.fetchone() == (1,)  # one of its two rows read
        with transaction.atomic():  # the connection commits: the statement is not in progress
            Run.objects.filter(id=run_id).update(error="")
        assert cursor.fetchone() == (1,) and cursor.fetchone() is None


@pytest.mark.postgres
def test_the_claim_is_planned_for_its_values_and_the_run_lookups_are_prepared():
    connection.close()
    for _ in range(7):  # past psycopg's threshold: a statement that could be prepared would be by now
        [claim] = leases.claim("w", 1, run_id=journal.start("twelve"))  # one run: one statement
        leases.claim("w", 1)  # the candidates query without a run id
        journal.start("twelve"), journal.start("twelve")
        assert len(leases.claim("w", 2)) == 2  # two: the candidates, then each one's move, in a transaction
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [row[0] for row in cursor.fetchall()]
    assert any(s.startswith("UPDATE") and "journal_run" in s for s in statements)  # the move: prepared
    assert any(s.startswith("SELECT") and "journal_harness" in s for s in statements)  # a start's lookup too
    assert not any("FOR UPDATE" in s or "SKIP LOCKED" in s for s in statements)  # the candidates: not


@pytest.mark.postgres
def test_a_start_statement_is_parsed_by_psycopg_once_not_on_every_start(monkeypatch):
    """A run's start has more parameters than psycopg caches the parse of by default (50): without the
    raised limit every start re-parsed its statement's text (0.26 ms of CPU)."""
    import psycopg._queries

    from journal.store import frozen

    journal.start("twelve")
    starts = [sql for shape, sql in frozen._SQL.items() if shape[0] == "insert_all" and "journal_run" in sql]
    assert any(sql.count("%s") > 50 for sql in starts)  # the case psycopg's default limit leaves out
    uncached = []
    parse = psycopg._queries._query2pg_nocache  # what psycopg calls for a statement it does not cache
    monkeypatch.setattr(psycopg._queries, "_query2pg_nocache", lambda *a: uncached.append(a) or parse(*a))
    for _ in range(3):
        journal.start("twelve")
    assert uncached == []
