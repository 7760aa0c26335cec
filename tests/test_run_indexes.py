"""The write path's schema. journal_run's indexes (migration 0010): none for a column its composite or
partial indexes already serve, none holding an entry for every run where only a few runs have a value,
and every lookup that lost its full index still finds its rows through an index on both databases.
The appended tables' keys on SQLite (migration 0011): no AUTOINCREMENT counter."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from journal.models import Erasure, Run, SessionEvent
from runs.queries import RunFilter

pytestmark = pytest.mark.django_db


def _indexes() -> dict[str, dict]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Run._meta.db_table)
    return {name: c for name, c in found.items() if c["index"] and not c["primary_key"] and not c["unique"]}


def test_no_full_index_of_a_column_that_is_empty_on_most_runs_or_led_by_a_composite():
    partial = {"run_parent": ["parent_id"], "run_forked_from": ["forked_from_id"], "run_erasure": ["erasure_id"],
               "run_subject": ["subject"]}
    indexes = _indexes()
    for name, columns in partial.items():
        assert indexes[name]["columns"] == columns
    single = {name: c["columns"] for name, c in indexes.items() if name not in partial and len(c["columns"]) == 1}
    for column in ("agent", "subject", "parent_id", "forked_from_id", "erasure_id"):
        assert [column] not in single.values(), (column, single)
    assert len(indexes) == 15, sorted(indexes)  # 19 before 0010 on PostgreSQL (two of them _like), 17 on SQLite


@pytest.fixture
def plans():
    """The planner's choice on a table of a handful of rows: PostgreSQL is told to prefer any index
    to a sequential scan (it would rightly scan three rows); SQLite plans by the query's shape."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
        yield
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_seqscan")
    else:
        yield


def test_the_lookups_that_lost_their_full_index_are_still_index_lookups(plans):
    erasure = Erasure.objects.create(actor="dpo", reason="request")
    parent = Run.objects.create(agent="a", subject="customer-42")
    Run.objects.create(agent="a", parent=parent, forked_from=parent, erasure=erasure)
    queries = {
        "run_parent": Run.objects.filter(parent_id=parent.id),
        "run_forked_from": Run.objects.filter(forked_from_id=parent.id),
        "run_erasure": Run.objects.filter(erasure_id=erasure.id),
        "run_subject": RunFilter(terms=[("subject", "customer-42")]).apply(Run.objects.all()),
        "run_agent_recent": Run.objects.filter(agent="a"),
    }
    for index, queryset in queries.items():
        plan = queryset.order_by().explain()
        assert index in plan, (index, plan)
    assert RunFilter(terms=[("subject", "customer-42")]).apply(Run.objects.all()).get() == parent
    assert list(parent.children.all()) == list(parent.forks.all()) == list(erasure.erased_runs.all())
    assert not Run.objects.filter(parent_id=uuid.uuid4()).exists()


def test_sqlite_appends_keep_no_autoincrement_counter():
    """journal.models.keys: no sqlite_sequence page in every step's commit; keys still grow."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL keeps its identity columns")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN "
                       "('journal_sessionevent', 'journal_tracespan', 'journal_checkpoint', 'journal_runstep')")
        tables = dict(cursor.fetchall())
    assert len(tables) == 4 and not any("AUTOINCREMENT" in sql.upper() for sql in tables.values()), tables
    run = Run.objects.create(agent="a")
    events = [SessionEvent.objects.create(run=run, seq=seq, kind="log") for seq in (1, 2, 3)]
    assert [e.id for e in events] == sorted(e.id for e in events) and len({e.id for e in events}) == 3
