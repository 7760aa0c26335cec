"""The session log is append-only: nothing but retention updates or deletes it."""

import pytest
from django.db import DatabaseError, connection, transaction

import journal
from journal.models import AppendOnlyError, EventKind, SessionEvent
from journal.operations.retention import allow_deletes
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
