"""Writes that would be a transaction of several statements, as one statement on PostgreSQL
(``writer._append_together``): a run's last write (the fenced move, the trace spans, the journal
rows) and a step's first record of its name (the rows and the search summary's names), all or none
exactly as the transaction they replace; and the same outcomes on SQLite, which keeps the transaction."""

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import journal
from journal.driver import executor, leases
from journal.models import EventKind, Run, RunStatus, RunStep, SessionEvent, TraceSpan
from journal.store import runstate, writer
from journal.store.errors import LeaseLost
from journal.store.writer import JournalWriter
from tests.agents import crashy  # noqa: F401 - registers "twelve"

pytestmark = pytest.mark.django_db(transaction=True)

SPAN_FIELDS = ("span_id", "parent_span_id", "name", "kind", "position", "attempt", "status", "error", "started_at",
               "ended_at", "duration_ms", "model", "tokens_in", "tokens_out", "cost", "attributes")


def _claimed() -> leases.Claim:
    [claim] = leases.claim("w", 1, run_id=journal.start("twelve", 0))
    return claim


def _complete(claim, writer_: JournalWriter, epoch: int | None = None) -> None:
    move = runstate.FencedMove(claim.run_id, claim.epoch if epoch is None else epoch, RunStatus.COMPLETED,
                               cause=runstate.Cause.SETTLE, sources=(RunStatus.RUNNING,), lease_owner="",
                               lease_expires_at=None, output={"total": 0})
    writer_.record(EventKind.RUN_COMPLETED, {"output": {"total": 0}}, extra=move)


def test_a_finished_run_settles_in_one_statement_with_its_spans():
    claim = _claimed()
    with CaptureQueriesContext(connection) as queries:
        assert executor.drive(claim, "w") == RunStatus.COMPLETED
    run = Run.objects.get(id=claim.run_id)
    assert (run.status, run.output, run.lease_owner, run.lease_expires_at) == ("completed", {"total": 0}, "", None)
    kinds = list(SessionEvent.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True))
    assert kinds == [EventKind.RUN_STARTED, EventKind.RUN_CLAIMED, EventKind.RUN_COMPLETED]
    statements = [q["sql"] for q in queries.captured_queries]
    if connection.vendor == "postgresql":  # the run's row and marks, then the move with the two rows
        assert len(statements) == 2 and statements[1].startswith("WITH gate AS (UPDATE")


def test_a_stale_epoch_writes_nothing_not_the_rows_and_not_the_move():
    claim = _claimed()
    w = JournalWriter(claim.run_id, claim.epoch, next_seq=2)
    w.record(EventKind.RUN_CLAIMED, {"epoch": claim.epoch}, durability="exit")
    w.add_span({"span_id": "a" * 16, "name": "step", "started_at": datetime.now(UTC)})
    Run.objects.filter(id=claim.run_id).update(epoch=claim.epoch + 1)  # another worker's claim, as it writes it
    with pytest.raises(LeaseLost):
        _complete(claim, w)
    run = Run.objects.get(id=claim.run_id)
    assert run.status == RunStatus.RUNNING and run.output is None
    assert SessionEvent.objects.filter(run_id=claim.run_id).count() == 1  # run_started only
    assert not TraceSpan.objects.filter(run_id=claim.run_id).exists()


def test_a_run_no_longer_running_is_not_moved_and_gets_no_rows():
    claim = _claimed()
    Run.objects.filter(id=claim.run_id).update(status=RunStatus.CANCELLED)
    w = JournalWriter(claim.run_id, claim.epoch, next_seq=2)
    with pytest.raises(LeaseLost):
        _complete(claim, w)
    assert Run.objects.get(id=claim.run_id).status == RunStatus.CANCELLED
    assert SessionEvent.objects.filter(run_id=claim.run_id).count() == 1


@pytest.mark.postgres
def test_spans_through_json_are_stored_as_the_span_insert_stores_them():
    started = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
    spans = [
        {"span_id": "1" * 16, "name": "plain", "position": 1, "started_at": started, "duration_ms": 1.25},
        {"span_id": "2" * 16, "parent_span_id": "1" * 16, "name": "odd\x00name\ud800", "kind": "llm",
         "position": None, "attempt": 3, "status": "error", "error": "boom \x00 \udcff", "started_at": started,
         "ended_at": started, "duration_ms": 0.0, "model": "gpt", "tokens_in": 7, "tokens_out": 9,
         "cost": Decimal("0.001234"), "attributes": {"when": started, "nested": {"x": [1, "\x00"]}}},
    ]
    a, b = _claimed(), _claimed()
    writer._insert_spans(a.run_id, spans)
    statement = runstate.FencedMove(b.run_id, b.epoch, RunStatus.COMPLETED, cause=runstate.Cause.SETTLE,
                                    sources=(RunStatus.RUNNING,)).statement()
    entry = writer.Entry(2, EventKind.RUN_COMPLETED, None, "", "{}", "", started)
    writer._append_together(b.run_id, b.epoch, [entry], spans, [], statement)

    def stored(run_id: uuid.UUID) -> list[tuple]:
        return list(TraceSpan.objects.filter(run_id=run_id).order_by("span_id").values_list(*SPAN_FIELDS))

    assert stored(a.run_id) == stored(b.run_id) and len(stored(b.run_id)) == 2
    assert Run.objects.get(id=b.run_id).status == RunStatus.COMPLETED


def test_a_first_step_of_its_name_writes_its_record_and_the_names_together():
    claim = _claimed()
    w = JournalWriter(claim.run_id, claim.epoch, next_seq=2)
    with CaptureQueriesContext(connection) as queries:
        w.record(EventKind.STEP_COMPLETED, {"result": 1}, position=1, step_name="tests.agents.crashy.work")
    names = set(RunStep.objects.filter(run_id=claim.run_id).values_list("name", flat=True))
    assert names == {"tests.agents.crashy.work", "agents.crashy.work", "crashy.work", "work"}
    assert SessionEvent.objects.filter(run_id=claim.run_id, position=1).count() == 1
    if connection.vendor == "postgresql":
        [statement] = [q["sql"] for q in queries.captured_queries]
        assert statement.startswith("WITH gate AS (SELECT 1 FROM journal_run") and "journal_runstep" in statement


def test_a_stale_epoch_writes_no_names_either():
    claim = _claimed()
    Run.objects.filter(id=claim.run_id).update(epoch=claim.epoch + 1)
    w = JournalWriter(claim.run_id, claim.epoch, next_seq=2)
    with pytest.raises(LeaseLost):
        w.record(EventKind.STEP_COMPLETED, {"result": 1}, position=1, step_name="work")
    assert not RunStep.objects.filter(run_id=claim.run_id).exists()
    assert SessionEvent.objects.filter(run_id=claim.run_id).count() == 1
