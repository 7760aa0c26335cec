"""The engine's own database faults are never a workflow's failure (faults injected in-process, both databases).

``journal.store.faults`` raises a real Django ``OperationalError`` at a named point (a journal write, a
lost commit reply, a claim, a lease renewal, an effect's ledger read). The tests check the rule of
``journal.store.outage``: the engine retries, or gives the run back without recording anything; only
an exception raised by workflow code fails a run; and no failed write uses up a sequence number.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter

import pytest
from django.db import DatabaseError, DataError, IntegrityError, InterfaceError, OperationalError

import journal
from journal.driver.worker import EmbeddedWorker
from journal.integrations import tasks
from journal.models import EffectStatus, EventKind, Run, RunStatus, SessionEvent, SideEffect
from journal.store import faults
from journal.store.outage import is_database_outage
from tests.agents import crashy, dbfaults  # noqa: F401  (registers their workflows)
from tests.checks import assert_no_seq_gaps

pytestmark = pytest.mark.django_db(transaction=True)
SQUARES = sum(i * i for i in range(1, 13))


@pytest.fixture
def inject(monkeypatch):
    def set_faults(rules: str, retry_seconds: float | None = None) -> None:
        monkeypatch.setenv("DURABLE_FAULTS", rules)
        if retry_seconds is not None:
            monkeypatch.setenv("DURABLE_DB_RETRY_SECONDS", str(retry_seconds))
        faults.reload()

    yield set_faults


def clear_faults(monkeypatch) -> None:
    monkeypatch.delenv("DURABLE_FAULTS", raising=False)
    faults.reload()


@pytest.fixture
def worker():
    w = EmbeddedWorker(concurrency=1, poll_interval=0.02)
    yield w
    w._pool.shutdown(wait=True)


def counts(tmp_path) -> Counter:
    return Counter(crashy.executions(tmp_path))


class _Cause(Exception):
    def __init__(self, sqlstate: str):
        self.sqlstate = sqlstate


def _wrapped(sqlstate: str) -> DatabaseError:
    exc = DatabaseError("wrapped")
    exc.__cause__ = _Cause(sqlstate)
    return exc


def test_what_counts_as_an_outage():
    assert is_database_outage(OperationalError("the database system is starting up"))
    assert is_database_outage(InterfaceError("connection already closed"))
    assert is_database_outage(_wrapped("57P01"))  # admin shutdown
    assert is_database_outage(_wrapped("08006"))  # connection failure
    assert not is_database_outage(DataError("invalid input syntax"))
    assert not is_database_outage(IntegrityError("duplicate key"))
    assert not is_database_outage(_wrapped("22001"))  # string data right truncation: bad data
    assert not is_database_outage(ValueError("not a database error"))


def test_a_write_failing_with_operational_error_is_retried_and_leaves_no_gap(inject, drive, tmp_path):
    inject("db_write:kind=step_completed;raise=operational;times=3")
    run_id = journal.start("twelve")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"total": SQUARES}
    assert faults.fired("db_write") == 3
    assert set(counts(tmp_path).values()) == {1}  # nothing ran twice
    assert_no_seq_gaps([run_id])


def test_a_commit_whose_answer_was_lost_is_not_written_twice(inject, drive, tmp_path):
    """The commit went through, the reply did not: the retry finds the entries and does not write again."""
    inject("db_reply:kind=step_completed;position=3;raise=operational;times=1")
    run_id = journal.start("twelve")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert faults.fired("db_reply") == 1
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, position=3).count() == 1
    assert set(counts(tmp_path).values()) == {1}
    assert_no_seq_gaps([run_id])


def test_an_outage_at_an_effects_result_is_waited_out_and_the_effect_runs_once(inject, drive, tmp_path):
    inject("db_write:kind=step_completed;position=5;raise=operational;times=4")  # step 5 is the first effect
    run_id = journal.start("twelve")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert set(counts(tmp_path).values()) == {1}
    assert SideEffect.objects.filter(run_id=run_id, status=EffectStatus.COMPLETED).count() == 3
    assert_no_seq_gaps([run_id])


def test_an_outage_past_the_retries_gives_the_run_back_without_failing_it(inject, worker, monkeypatch, tmp_path):
    inject("db_write:kind=step_completed;position=6;raise=operational", retry_seconds=0.3)
    run_id = journal.start("twelve")
    assert worker.drive_one(run_id) == "unavailable"
    run = journal.get_run(run_id)
    assert run.status == RunStatus.RUNNING and run.error == "" and run.lease_owner == worker.id
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.RUN_FAILED).exists()
    assert worker.db.down and worker.db.outages == 1
    assert_no_seq_gaps([run_id])

    clear_faults(monkeypatch)  # the database is back: the run is given back and recovered at once
    assert worker.drive_one(run_id) == RunStatus.COMPLETED
    run = journal.get_run(run_id)
    assert run.output == {"total": SQUARES}
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.RUN_RECOVERED).count() == 1
    ran = counts(tmp_path)
    assert ran["step 5"] == 2  # the plain step whose record never committed ran again; nothing else did
    assert all(n == 1 for line, n in ran.items() if line != "step 5"), ran
    assert_no_seq_gaps([run_id])


def test_an_effect_whose_result_could_not_be_recorded_is_in_doubt_not_failed(inject, worker, monkeypatch, tmp_path):
    inject("db_write:kind=step_completed;position=5;raise=operational", retry_seconds=0.3)
    run_id = journal.start("twelve")
    assert worker.drive_one(run_id) == "unavailable"
    clear_faults(monkeypatch)
    assert worker.drive_one(run_id) == RunStatus.NEEDS_ATTENTION
    assert SideEffect.objects.get(run_id=run_id, position=5).status == EffectStatus.STARTED
    assert [line for line in crashy.executions(tmp_path) if line.startswith("effect")] == [f"effect {run_id}:5"]
    assert_no_seq_gaps([run_id])


def test_an_outage_in_an_effects_ledger_read_is_the_engines(inject, worker, monkeypatch, tmp_path):
    inject("effect_lookup:position=5;raise=operational;times=1")
    run_id = journal.start("twelve")
    assert worker.drive_one(run_id) == "unavailable"
    assert journal.get_run(run_id).status == RunStatus.RUNNING
    clear_faults(monkeypatch)
    assert worker.drive_one(run_id) == RunStatus.COMPLETED
    assert set(counts(tmp_path).values()) == {1}
    assert_no_seq_gaps([run_id])


def test_workflow_code_cannot_swallow_the_engines_outage(inject, worker, monkeypatch, tmp_path):
    inject("db_write:kind=step_completed;position=1;raise=operational", retry_seconds=0.2)
    run_id = journal.start("swallows")
    assert worker.drive_one(run_id) == "unavailable"  # not "completed" with "swallowed"
    clear_faults(monkeypatch)
    assert worker.drive_one(run_id) == RunStatus.COMPLETED
    assert journal.get_run(run_id).output == "recorded"
    assert_no_seq_gaps([run_id])


def test_a_steps_own_database_error_is_the_workflows(drive, tmp_path):
    """The step talks to some database of its own and gets OperationalError: retried, then the step fails."""
    run_id = journal.start("own_database")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED
    assert "query_warehouse" in run.error and "OperationalError" in run.error
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_FAILED).count() == 2  # retries=1
    assert_no_seq_gaps([run_id])


def test_a_workflow_bodys_own_database_error_is_the_workflows(drive):
    run_id = journal.start("body_queries")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "OperationalError", run.error
    assert_no_seq_gaps([run_id])


def test_a_write_refused_for_its_data_takes_no_sequence_number(inject, drive):
    """Not an outage: the run fails (as before), and its failure record takes the seq the refused write did not."""
    inject("db_write:kind=step_completed;position=2;raise=data;times=1")
    run_id = journal.start("twelve")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "DataError", run.error
    assert_no_seq_gaps([run_id])


def test_the_worker_keeps_polling_through_an_outage_and_says_so_once(inject, caplog):
    inject("claim:raise=operational;times=6,renew:raise=operational;times=3")
    run_id = journal.start("twelve")
    worker = EmbeddedWorker(concurrency=2, poll_interval=0.01, ttl=1)
    with caplog.at_level(logging.WARNING, logger="journal.driver.worker"):
        worker.run(until_idle=True, max_seconds=60)
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    assert faults.fired("claim") == 6
    messages = [r.getMessage() for r in caplog.records]
    said = ["down" if "database is unavailable" in m else "up" for m in messages
            if "database is unavailable" in m or "answers again" in m]
    # Once per outage: the six failed claims are one. The three failed renewals are one more, or a
    # few more when a claim got through between them (a slot was free), each then closed by "answers again".
    assert said[:2] == ["down", "up"], messages
    assert all(a != b for a, b in itertools.pairwise(said)), messages  # never "unavailable" twice in one outage
    assert said.count("down") == worker.db.outages <= 4 and said[-1] == "up", messages
    assert_no_seq_gaps([run_id])


def test_the_celery_task_retries_through_an_outage(inject, monkeypatch):
    inject("claim:raise=operational;times=2")
    run_id = journal.start("twelve")
    try:
        result = tasks.advance_run.apply(args=[run_id])
        assert result.get() == RunStatus.COMPLETED
    finally:
        if tasks._worker is not None:
            tasks._worker.stopping.set()
            tasks._worker = None
    assert faults.fired("claim") == 2
    assert Run.objects.get(id=run_id).status == RunStatus.COMPLETED
    assert_no_seq_gaps([run_id])


def test_the_celery_task_gives_a_run_back_and_retries_when_the_outage_hits_mid_run(inject, monkeypatch, tmp_path):
    inject("db_write:kind=step_completed;position=6;raise=operational;times=6", retry_seconds=0.2)
    run_id = journal.start("twelve")
    try:
        assert tasks.advance_run.apply(args=[run_id]).get() == RunStatus.COMPLETED
    finally:
        if tasks._worker is not None:
            tasks._worker.stopping.set()
            tasks._worker = None
    run = Run.objects.get(id=run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"total": SQUARES}
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.RUN_FAILED).exists()
    assert_no_seq_gaps([run_id])
