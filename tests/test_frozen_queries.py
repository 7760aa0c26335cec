"""The engine's compiled hot queries answer exactly what the ORM answers, with the same Python types."""

import uuid
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, connections
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import journal
from journal.driver import leases
from journal.engine.history import load_journal, load_run
from journal.models import AgentPause, EventKind, Run, RunStatus, SessionEvent
from journal.store import frozen
from tests.agents import crashy  # noqa: F401 - registers the workflows these tests start
from tests.checks import sqlite_vm_steps

pytestmark = pytest.mark.django_db(transaction=True)


OWNER = "worker-a"


def _own(now) -> dict:
    return {"owner": OWNER, "grace": now - timedelta(seconds=30)}


def _orm_candidates(now, run_id=None, n=8):
    qs = Run.objects.runnable(now).exclude(lease_owner=OWNER, status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING],
                                           lease_expires_at__gte=now - timedelta(seconds=30))
    if run_id is not None:
        qs = qs.filter(id=run_id)
    return list(qs.exclude(concurrency_key__in=leases._full_groups()).order_by("created_at")
                .values(*leases._CLAIM_FIELDS)[:n])


def test_the_compiled_claim_query_finds_what_the_orm_finds_with_fresh_values_each_call():
    now = timezone.now()
    ids = [uuid.UUID(journal.start("twelve")) for _ in range(5)]
    Run.objects.filter(id=ids[1]).update(status=RunStatus.SUSPENDED, wake_at=now + timedelta(hours=1))
    Run.objects.filter(id=ids[2]).update(status=RunStatus.SUSPENDED, wake_at=now - timedelta(seconds=1))
    Run.objects.filter(id=ids[3]).update(status=RunStatus.RUNNING, lease_owner="gone",
                                         lease_expires_at=now - timedelta(seconds=1), started_at=now)
    Run.objects.filter(id=ids[4]).update(paused=True)
    for when in (now, now + timedelta(hours=2)):  # the same compiled SQL, a later time: the timer is due
        rows = leases._CANDIDATES.rows((False, 8, False), now=when, **_own(when))
        assert rows == _orm_candidates(when)
    assert {r["id"] for r in leases._CANDIDATES.rows((False, 8, False), now=now, **_own(now))} == {
        ids[0], ids[2], ids[3]}
    [row] = leases._CANDIDATES.rows((True, 4, False), now=now, run_id=ids[3], **_own(now))
    assert row == _orm_candidates(now, ids[3])[0]
    assert isinstance(row["id"], uuid.UUID) and row["started_at"].tzinfo is not None
    assert leases._CANDIDATES.rows((True, 4, False), now=now, run_id=str(ids[1]), **_own(now)) == []


def test_the_claim_merging_each_kind_of_runnable_run_finds_what_the_one_condition_finds():
    """SQLite's claim asks each kind of runnable run for its oldest (``leases._oldest``); merged, they
    must be the oldest of the union in order, with no run twice, whatever ``n``."""
    now = timezone.now()
    ids = [uuid.UUID(journal.start("twelve")) for _ in range(12)]
    lapsed = {"lease_expires_at": now - timedelta(seconds=1), "started_at": now}
    Run.objects.filter(id=ids[1]).update(status=RunStatus.SUSPENDED, wake_at=now + timedelta(hours=1))
    Run.objects.filter(id=ids[2]).update(status=RunStatus.SUSPENDED, wake_at=now - timedelta(seconds=1))
    Run.objects.filter(id=ids[3]).update(status=RunStatus.RUNNING, lease_owner="gone", **lapsed)
    Run.objects.filter(id=ids[4]).update(paused=True)
    Run.objects.filter(id=ids[5]).update(status=RunStatus.RUNNING, lease_owner=OWNER, **lapsed)  # its own: not yet
    Run.objects.filter(id=ids[6]).update(status=RunStatus.COMPENSATING, lease_owner="", **lapsed)  # two kinds at once
    Run.objects.filter(id=ids[7]).update(status=RunStatus.RUNNING, lease_owner="alive",
                                         lease_expires_at=now + timedelta(seconds=30), started_at=now)
    Run.objects.filter(id=ids[8]).update(status=RunStatus.COMPLETED)
    for when in (now, now + timedelta(hours=2)):
        expected = _orm_candidates(when, n=20)
        for n in range(1, 12):
            rows = leases._oldest(n, {"now": when, **_own(when)})
            assert [r["id"] for r in rows] == [r["id"] for r in expected[:n]], n
            assert [{k: r[k] for k in leases._CLAIM_FIELDS} for r in rows] == expected[:n]
    assert ids[5] not in {r["id"] for r in leases._oldest(20, {"now": now, **_own(now)})}


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's claim; PostgreSQL plans the one condition well")
def test_a_claim_does_not_read_the_whole_backlog_of_pending_runs():
    """A claim wants the oldest few runnable runs. Read as one ORed condition, SQLite took every pending
    run and sorted them: 0.4 ms a claim at 100 pending, 6.6 ms at 10,000."""
    now = timezone.now()
    values = {"now": now, **_own(now)}

    def backlog(n: int) -> int:
        Run.objects.bulk_create([Run(agent="twelve", input={}) for _ in range(n - Run.objects.count())])
        leases._oldest(4, values)  # compiled, cached
        return sqlite_vm_steps(lambda: leases._oldest(4, values))

    small, large = backlog(50), backlog(2000)
    assert large < small * 1.5, (small, large)
    assert len(leases._oldest(4, values)) == 4


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's claim; PostgreSQL plans the one condition well")
def test_a_claim_does_not_read_every_suspended_run_to_find_the_due_timers():
    """Runs waiting days for an approval or a timer are not the claim's to read: it finds the due
    timers and lapsed leases along their partial indexes (at 10,000 suspended runs an empty claim
    cost 1.4-1.9 ms through the status index, 0.04 ms along them)."""
    now = timezone.now()
    values = {"now": now, **_own(now)}
    due = Run.objects.create(agent="twelve", input={}, status=RunStatus.SUSPENDED, wake_at=now - timedelta(seconds=1))

    def suspended(n: int) -> int:
        later = now + timedelta(days=3)
        Run.objects.bulk_create([Run(agent="twelve", input={}, status=RunStatus.SUSPENDED,
                                     wake_at=later if i % 2 else None) for i in range(n - Run.objects.count())])
        leases._oldest(4, values)
        return sqlite_vm_steps(lambda: leases._oldest(4, values))

    small, large = suspended(50), suspended(2000)
    assert large < small * 1.5, (small, large)
    assert [row["id"] for row in leases._oldest(4, values)] == [due.id]


def test_a_value_the_query_does_not_use_is_refused_rather_than_ignored():
    query = frozen.FrozenQuery(Run, ("id",), lambda _v, run_id: Run.objects.filter(status="pending").values("id"),
                               run_id=frozen.SENTINEL_UUID)
    with pytest.raises(ValueError, match="run_id"):
        query.rows(run_id=uuid.uuid4())


def test_only_plain_words_are_written_into_the_sql_every_other_value_stays_a_parameter():
    query = frozen.FrozenQuery(
        Run, ("id",), lambda _v, now: Run.objects.filter(
            status="pending", lease_owner="", agent="O'Brien; DROP", error="Pending", created_at__lte=now).values("id"),
        literals=True, now=frozen.SENTINEL_TIME)
    sql, params = query.statement(None, now=timezone.now())
    assert "'pending'" in sql and "''" in sql
    assert "O'Brien" not in sql and "Pending" not in sql
    assert "O'Brien; DROP" in params and "Pending" in params and len(params) == 3
    Run.objects.create(agent="O'Brien; DROP", input={}, error="Pending")
    assert len(query.rows(None, now=timezone.now())) == 1


def test_get_builds_the_model_the_orm_would():
    parent = journal.start("twelve")
    child = journal.start_run("twelve", (), {}, parent_id=parent)
    got, expected = frozen.get(Run, uuid.UUID(child)), Run.objects.get(id=child)
    for field in Run._meta.concrete_fields:
        assert getattr(got, field.attname) == getattr(expected, field.attname), field.attname
        assert type(getattr(got, field.attname)) is type(getattr(expected, field.attname)), field.attname
    assert got.parent_id == uuid.UUID(parent) and not got._state.adding
    with pytest.raises(Run.DoesNotExist):
        frozen.get(Run, uuid.uuid4())


def test_update_writes_what_the_orm_writes_and_leaves_expressions_to_it():
    a, b = journal.start("twelve"), journal.start("twelve")
    now = timezone.now()
    moved = frozen.update(Run.objects, {"id": a, "status__in": ["pending", "suspended"], "epoch": 0},
                          {"status": RunStatus.RUNNING, "lease_owner": "w", "lease_expires_at": now,
                           "waiting_for": {"kind": "signal"}, "progress": None})
    assert moved == 1
    run = Run.objects.get(id=a)
    assert (run.status, run.lease_owner, run.lease_expires_at, run.waiting_for, run.progress) == (
        "running", "w", now, {"kind": "signal"}, None)
    assert frozen.update(Run.objects, {"id": a, "status__in": ["pending"]}, {"status": "failed"}) == 0
    assert frozen.update(Run.objects, {"id": b}, {"tokens": F("tokens") + 5}) == 1  # through the ORM
    assert Run.objects.get(id=b).tokens == 5


@pytest.mark.parametrize("harness_exists", [False, True], ids=["first start of a version", "later starts"])
def test_start_writes_the_run_and_its_first_event_as_the_orm_did(harness_exists):
    if harness_exists:
        assert not Run.objects.get(id=journal.start("twelve", 1, 0)).paused
    AgentPause.objects.create(agent="twelve", paused_by="ops", reason="maintenance")
    run_id = journal.start("twelve", 3, 0)
    run = Run.objects.get(id=run_id)
    assert run.paused and run.paused_by == "ops" and run.pause_reason == "agent paused: maintenance"
    assert run.input == {"args": [3, 0], "kwargs": {}} and run.harness.name == "twelve"
    assert run.created_at is not None and run.updated_at is not None
    [event] = SessionEvent.objects.filter(run_id=run_id)
    assert (event.seq, event.kind, event.payload["input"]) == (1, EventKind.RUN_STARTED, run.input)


def test_load_journal_reads_what_the_orm_reads(drive):
    run_id = journal.start("twelve", 4, 2)
    drive()
    recorded, markers, last = load_journal(run_id)
    rows = list(SessionEvent.objects.filter(run_id=run_id, position__isnull=False, kind=EventKind.STEP_COMPLETED)
                .order_by("seq").values("position", "seq", "payload"))
    assert sorted(recorded) == [r["position"] for r in rows]
    assert all(recorded[r["position"]]["payload"] == r["payload"] for r in rows)
    assert last == SessionEvent.objects.filter(run_id=run_id).count()
    assert load_journal(uuid.uuid4()) == ({}, {}, 0)


def test_a_later_start_reads_once_and_writes_once():
    """The harness row and the agent's pause in one SELECT; on PostgreSQL the run and its first event
    in one statement (no BEGIN or COMMIT to wait for), elsewhere in one transaction."""
    journal.start("twelve", 1, 0)  # the version's harness row exists from here on
    with CaptureQueriesContext(connection) as queries:
        journal.start("twelve", 2, 0)
    statements = [q["sql"] for q in queries.captured_queries]
    reads = [sql for sql in statements if sql.startswith("SELECT")]
    assert len(reads) == 1 and "journal_harness" in reads[0] and "journal_agentpause" in reads[0]
    writes = [sql for sql in statements if "INSERT" in sql]
    if connection.vendor == "postgresql":
        assert len(statements) == 2 and writes[0].startswith("WITH ") and writes[0].count("INSERT INTO") == 2
    else:
        assert len(writes) == 2


def test_insert_all_writes_every_row_or_none():
    run = Run(agent="twelve", input={"args": [], "kwargs": {}})
    bad = SessionEvent(run_id=run.id, seq=-1, kind=EventKind.RUN_STARTED, payload={})  # seq >= 0 is checked
    with pytest.raises(IntegrityError):
        frozen.insert_all([run, bad])
    assert not Run.objects.filter(id=run.id).exists()
    good = SessionEvent(run_id=run.id, seq=1, kind=EventKind.RUN_STARTED, payload={"input": run.input})
    frozen.insert_all([run, good])
    assert Run.objects.get(id=run.id).input == run.input
    assert list(SessionEvent.objects.filter(run_id=run.id).values_list("seq", "payload")) == [(1, {"input": run.input})]


@pytest.mark.parametrize("values", [
    {},
    {"paused": True, "paused_by": "ops", "pause_reason": "agent paused", "concurrency_limit": 3,
     "concurrency_key": "g", "cost": Decimal("1.5"), "waited": timedelta(seconds=4), "output": [1, "two"]},
], ids=["defaults", "named"])
def test_a_row_inserts_the_columns_the_model_would(values):
    """``frozen.Row`` leaves a model's defaults to a template prepared once: every column must come out
    as ``Model(**values)`` inserted by the ORM would have it (but the time it was made)."""
    by_row, by_model = uuid.uuid4(), uuid.uuid4()
    common = {"agent": "twelve", "input": {"args": [1], "kwargs": {}}, **values}
    frozen.insert_all([frozen.Row(Run, id=by_row, **common),
                       frozen.Row(SessionEvent, run_id=by_row, seq=1, kind=EventKind.RUN_STARTED, payload={"a": 1})])
    Run.objects.create(id=by_model, **common)
    SessionEvent.objects.create(run_id=by_model, seq=1, kind=EventKind.RUN_STARTED, payload={"a": 1})
    row, model = Run.objects.get(id=by_row), Run.objects.get(id=by_model)
    for field in Run._meta.concrete_fields:
        if field.name in ("created_at", "updated_at"):  # stamped when each was made
            assert abs(getattr(row, field.name) - getattr(model, field.name)) < timedelta(minutes=1)
        elif field.name != "id":
            assert getattr(row, field.attname) == getattr(model, field.attname), field.name
    events = [SessionEvent.objects.values("seq", "kind", "position", "step_name", "payload", "actor").get(run_id=rid)
              for rid in (by_row, by_model)]
    assert events[0] == events[1]
    with pytest.raises(TypeError, match="no column"):
        frozen.insert_all([frozen.Row(Run, id=uuid.uuid4(), agent="twelve", colour="red")])


def test_load_run_reads_what_get_and_load_journal_read(drive):
    fresh = journal.start("twelve", 4, 2)
    with CaptureQueriesContext(connection) as queries:
        run, recorded, markers, last = load_run(uuid.UUID(fresh))
    assert len(queries.captured_queries) == 1  # a fresh run: its row and its journal's marks together
    assert (recorded, markers, last) == ({}, {}, 1) == load_journal(fresh)
    expected = Run.objects.get(id=fresh)
    for field in Run._meta.concrete_fields:
        assert getattr(run, field.attname) == getattr(expected, field.attname), field.attname
    drive()
    run, recorded, markers, last = load_run(uuid.UUID(fresh))
    assert (recorded, markers, last) == load_journal(fresh) and len(recorded) > 0
    assert run.status == RunStatus.COMPLETED and not run._state.adding
    with pytest.raises(Run.DoesNotExist):
        load_run(uuid.uuid4())


def test_values_are_prepared_for_the_database_exactly_as_their_fields_prepare_them(drive):
    run_id = journal.start("twelve", 2, 0)
    drive()
    conn = connections["default"]
    run = Run.objects.get(id=run_id)
    rows = [run, *SessionEvent.objects.filter(run_id=run_id)]
    checked = 0
    for obj in rows:
        for field in type(obj)._meta.concrete_fields:
            for value in (getattr(obj, field.attname), None):
                if value is None and not field.null:
                    continue
                ours, django = frozen._prepared_for_save(field, value, conn), field.get_db_prep_save(value, conn)
                assert getattr(ours, "obj", ours) == getattr(django, "obj", django), field  # psycopg's Jsonb wraps
                checked += 1
    assert checked > 40
    tokens, name = Run._meta.get_field("tokens"), Run._meta.get_field("agent")
    assert frozen._prepared_for_save(tokens, True, conn) == tokens.get_db_prep_save(True, conn)  # a bool is no int
    assert frozen._prepared_for_save(name, 7, conn) == "7"  # another type goes through the field
    assert frozen._prepared_for_lookup(tokens, 3, conn) == 3
    created = Run._meta.get_field("created_at")  # times: a UTC one takes the short path, the rest Django's
    for value in (datetime(2026, 12, 2, 5, 6, 7, tzinfo=UTC), datetime(2026, 12, 2, 5, 6, 7, 89, tzinfo=UTC),
                  datetime(2026, 12, 2, 5, 6, 7, tzinfo=dt_timezone(timedelta(hours=2)))):
        assert frozen._prepared_for_save(created, value, conn) == created.get_db_prep_save(value, conn), value
        assert frozen._prepared_for_lookup(created, value, conn) == created.get_db_prep_value(value, conn), value
