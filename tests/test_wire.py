"""The journal's append straight through libpq on PostgreSQL (journal/store/wire.py): the same rows as
through psycopg's cursor, the fence still refusing a stale epoch, values only psycopg may send handed to
it before anything is sent, server errors and outages still Django's, a statement dropped behind its
back prepared again."""

import uuid
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.db.utils import DataError, IntegrityError, OperationalError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import journal
from journal.driver import leases
from journal.models import EventKind, Run, SessionEvent
from journal.store import outage, prepared, wire
from journal.store.errors import LeaseLost
from journal.store.writer import Entry, fenced_append
from tests.agents import crashy  # noqa: F401 - registers "twelve"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _claimed():
    [claim] = leases.claim("w", 1, run_id=journal.start("twelve"))
    return claim


def _entry(seq: int, **overrides) -> Entry:
    values = {"kind": EventKind.LOG, "position": seq, "step_name": "s", "payload": '{"message": "m"}',
              "actor": "", "created_at": timezone.now(), **overrides}
    return Entry(seq, values["kind"], values["position"], values["step_name"], values["payload"],
                 values["actor"], values["created_at"])


def test_an_append_goes_through_libpq_and_stores_what_the_cursor_would():
    claim = _claimed()
    at = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        fenced_append(claim.run_id, claim.epoch, [_entry(5, payload='{"é": "ü", "n": null}', created_at=at,
                                                         position=None, actor="alice")])
    event = SessionEvent.objects.get(run_id=claim.run_id, seq=5)
    assert (event.payload, event.position, event.actor, event.created_at) == ({"é": "ü", "n": None}, None, "alice", at)
    assert any("-- libpq" in q["sql"] for q in queries.captured_queries)


def test_a_stale_epoch_inserts_nothing_and_is_a_lost_lease():
    claim = _claimed()
    with pytest.raises(LeaseLost):
        fenced_append(claim.run_id, claim.epoch - 1, [_entry(5)])
    assert not SessionEvent.objects.filter(run_id=claim.run_id, seq=5).exists()


@pytest.mark.parametrize("value", ["nul \x00 inside", "lone \ud800 surrogate", datetime(2026, 1, 1), 1.5])
def test_a_value_only_psycopg_may_send_is_left_to_it_before_anything_is_sent(value):
    sql = "SELECT %s"
    assert wire.execute(connection, sql, [value]) is None


def test_text_with_a_nul_is_refused_as_psycopg_refuses_it():
    claim = _claimed()
    with pytest.raises(DataError):  # psycopg's own refusal, Django's class: never a cut-short row
        fenced_append(claim.run_id, claim.epoch, [_entry(5, step_name="a\x00b")])
    assert not SessionEvent.objects.filter(run_id=claim.run_id, seq=5).exists()


def test_a_server_error_is_djangos_and_the_connection_goes_on():
    claim = _claimed()
    fenced_append(claim.run_id, claim.epoch, [_entry(5)])
    with pytest.raises(IntegrityError):
        fenced_append(claim.run_id, claim.epoch, [_entry(5)])  # the same seq twice
    fenced_append(claim.run_id, claim.epoch, [_entry(6)])
    assert SessionEvent.objects.filter(run_id=claim.run_id, seq__in=[5, 6]).count() == 2


def test_a_statement_dropped_behind_its_back_is_prepared_again():
    claim = _claimed()
    fenced_append(claim.run_id, claim.epoch, [_entry(5)])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does
    fenced_append(claim.run_id, claim.epoch, [_entry(6)])
    assert SessionEvent.objects.filter(run_id=claim.run_id, seq__in=[5, 6]).count() == 2


def test_a_connection_ended_by_the_server_is_an_outage():
    claim = _claimed()
    fenced_append(claim.run_id, claim.epoch, [_entry(5)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:  # as a server restart would
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    with pytest.raises(OperationalError) as caught:
        fenced_append(claim.run_id, claim.epoch, [_entry(6)])
    assert outage.is_database_outage(caught.value)
    connection.close()
    fenced_append(claim.run_id, claim.epoch, [_entry(6)])  # a new connection prepares its own
    assert SessionEvent.objects.filter(run_id=claim.run_id, seq=6).exists()


def test_with_preparing_off_the_append_goes_through_djangos_cursor(monkeypatch):
    monkeypatch.setenv("DURABLE_PG_PREPARE", "0")
    claim = _claimed()
    with CaptureQueriesContext(connection) as queries:
        fenced_append(claim.run_id, claim.epoch, [_entry(5)])
    appends = [q["sql"] for q in queries.captured_queries if "journal_sessionevent" in q["sql"]]
    assert appends and not any("-- libpq" in sql for sql in appends)
    assert prepared.execute(connection, "SELECT %s::uuid", [uuid.uuid4()]) == 1


def test_in_a_transaction_the_first_statement_opens_it_through_psycopg_and_a_rollback_takes_both():
    claim = _claimed()
    with pytest.raises(RuntimeError), transaction.atomic():
        fenced_append(claim.run_id, claim.epoch, [_entry(5)])  # psycopg: BEGIN, then the row
        with CaptureQueriesContext(connection) as queries:
            fenced_append(claim.run_id, claim.epoch, [_entry(6)])  # libpq, inside that transaction
        assert any("-- libpq" in q["sql"] for q in queries.captured_queries)
        raise RuntimeError("roll back")
    assert not SessionEvent.objects.filter(run_id=claim.run_id, seq__in=[5, 6]).exists()


def test_json_intervals_and_decimals_go_as_text_and_read_back_as_sent():
    from psycopg.types.json import Jsonb

    run_id = uuid.UUID(journal.start("twelve"))
    sql = "UPDATE journal_run SET output = %s, waited = %s, cost = %s WHERE id = %s"
    waited = timedelta(days=-1, seconds=5, microseconds=7)
    assert wire.execute(connection, sql, [Jsonb({"é": [1, None]}), waited, Decimal("0.000123"), run_id]) == 1
    run = Run.objects.get(id=run_id)
    assert (run.output, run.waited, run.cost) == ({"é": [1, None]}, waited, Decimal("0.000123"))


def test_a_connection_prepares_a_bounded_number_of_statements_and_psycopg_takes_the_rest(monkeypatch):
    """An async writer's batches come in every size, one statement each: past the bound they go through
    psycopg's cursor, whose prepared statements are its own bounded cache."""
    monkeypatch.setattr(wire, "PREPARED_MAX", 2)
    claim = _claimed()
    connection.close()
    with CaptureQueriesContext(connection) as queries:
        for size, first in ((1, 5), (2, 6), (3, 8), (1, 11)):
            fenced_append(claim.run_id, claim.epoch, [_entry(first + i) for i in range(size)])
    how = ["libpq" if "-- libpq" in q["sql"] else "cursor" for q in queries.captured_queries
           if "journal_sessionevent" in q["sql"]]
    assert how == ["libpq", "libpq", "cursor", "libpq"]  # the third size is the third statement
    assert SessionEvent.objects.filter(run_id=claim.run_id, seq__gte=5).count() == 7
