"""The write-path migrations (0009's fence as the reference check, 0010's indexes, 0011's keys) unapply
and apply again on a database that holds runs, on both databases, and the rows come through intact."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

import journal
from journal.models import Run, SessionEvent, TraceSpan

pytestmark = pytest.mark.django_db(transaction=True)


@journal.step()
def add_one(i: int) -> int:
    return i + 1


@journal.workflow(name="migrated_sum")
def migrated_sum(ctx, n: int) -> int:
    return sum(add_one(i) for i in range(n))


def _rows() -> tuple[int, list[tuple], int]:
    events = list(SessionEvent.objects.order_by("run_id", "seq").values_list("run_id", "seq", "kind", "payload"))
    return Run.objects.count(), events, TraceSpan.objects.count()


def test_unapplied_to_0008_and_applied_again_with_runs_in_place(drive):
    run_ids = [journal.start(migrated_sum, 3) for _ in range(3)]
    drive()
    before = _rows()
    assert before[0] == 3 and len(before[1]) >= 3 * 5
    try:
        call_command("migrate", "journal", "0008", verbosity=0)
        assert _rows() == before
    finally:
        call_command("migrate", "journal", verbosity=0)
    assert _rows() == before
    again = journal.start(migrated_sum, 2)  # the engine writes on the schema it came back to
    drive()
    assert journal.wait(again).output == 3 and all(journal.wait(r).output == 6 for r in run_ids)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:  # the trigger is back
        cursor.execute("DELETE FROM journal_run WHERE id = %s",
                       [Run._meta.pk.get_db_prep_value(run_ids[0], connection)])
