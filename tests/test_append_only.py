"""The session log is append-only: nothing but retention updates or deletes it."""

import uuid

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

import journal
from journal.models import AppendOnlyError, EventKind, Run, SessionEvent
from journal.operations.retention import allow_deletes
from journal.store import writer as writer_module
from journal.store.errors import LeaseLost
from journal.store.writer import Entry, fenced_append
from tests.agents import crashy  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)


def _event():
    run_id = journal.start("twelve")
    return SessionEvent.objects.get(run_id=run_id, kind=EventKind.RUN_STARTED)


def test_the_orm_refuses_to_update_or_delete_session_events():
    event = _event()
    event.payload = {"tampered": True}
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        SessionEvent.objects.filter(id=event.id).update(kind="log")
    with pytest.raises(AppendOnlyError):
        SessionEvent.objects.filter(id=event.id).delete()
    with pytest.raises(AppendOnlyError):
        event.delete()
    assert SessionEvent.objects.get(id=event.id).kind == EventKind.RUN_STARTED


@pytest.mark.postgres
def test_postgresql_refuses_raw_updates_and_deletes_too():
    event = _event()
    for sql in ("UPDATE journal_sessionevent SET kind = 'log' WHERE id = %s",
                "DELETE FROM journal_sessionevent WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, [event.id])
    assert SessionEvent.objects.filter(id=event.id).exists()


def test_retention_may_delete():
    event = _event()
    with transaction.atomic(), allow_deletes():
        SessionEvent.objects.filter(id=event.id).delete()
    assert not SessionEvent.objects.filter(id=event.id).exists()


def test_a_run_is_not_deleted_while_its_session_remains():
    """The foreign key's refusal: SQLite's key, PostgreSQL's trigger where the key is gone (0009)."""
    event = _event()
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM journal_run WHERE id = %s",
                    [Run._meta.pk.get_db_prep_value(event.run_id, connection)])
    assert Run.objects.filter(id=event.run_id).exists() and SessionEvent.objects.filter(id=event.id).exists()
    with transaction.atomic(), allow_deletes():  # the ORM's cascade deletes the events first: retention's way
        Run.objects.filter(id=event.run_id).delete()
    assert not Run.objects.filter(id=event.run_id).exists()
    assert not SessionEvent.objects.filter(run_id=event.run_id).exists()


def test_an_append_to_a_run_that_is_gone_writes_nothing():
    """What the foreign key refused, the fence refuses: no run row, no epoch to match, no record."""
    missing = uuid.uuid4()
    entry = Entry(2, EventKind.STEP_COMPLETED, 1, "a", '{"result": 1}', "", timezone.now())
    with pytest.raises(LeaseLost):
        fenced_append(missing, 1, [entry])
    assert writer_module._fenced_insert_group([(missing, 1, [entry])]) == set()  # a group commit's form
    assert not SessionEvent.objects.filter(run_id=missing).exists()
