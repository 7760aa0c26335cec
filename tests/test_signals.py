"""Signals: durable, buffered before the wait, idempotent under a signal id, refused clearly when they cannot apply."""

import threading

import pytest

import journal
from journal.models import EventKind, Run, RunStatus, SessionEvent, Signal
from tests.agents import waiting  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)



def test_wait_suspends_without_a_thread_and_a_signal_resumes_it(drive):
    run_id = journal.start("wait-signal")
    worker = drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.SUSPENDED and run.lease_owner == "" and run.wake_at is None
    assert run.waiting_for == {"kind": "signal", "name": "go", "position": 1, "deadline": None}
    assert not worker._active  # nothing is being driven: the wait is a row, not a thread
    journal.signal(run_id, "go", {"ok": 1}, actor="alice")
    assert journal.get_run(run_id).status == RunStatus.PENDING
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"payload": {"ok": 1}}
    step = SessionEvent.objects.get(run_id=run_id, kind=EventKind.STEP_COMPLETED, position=1)
    assert step.actor == "alice" and step.payload["sent_by"] == "alice"
    assert Signal.objects.get(run_id=run_id).consumed_position == 1


def test_a_signal_sent_before_the_wait_is_buffered(drive):
    run_id = journal.start("wait-signal")
    journal.signal(run_id, "go", "early")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"payload": "early"}
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.SUSPENDED).exists()


def test_signal_id_makes_delivery_idempotent(drive):
    run_id = journal.start("wait-signal")
    first = journal.signal(run_id, "go", 1, signal_id="abc")
    second = journal.signal(run_id, "go", 2, signal_id="abc")
    assert first.pk == second.pk and Signal.objects.filter(run_id=run_id).count() == 1
    drive()
    assert journal.get_run(run_id).output == {"payload": 1}


def test_concurrent_duplicate_signals_record_one(drive):
    run_id = journal.start("wait-signal")
    drive()
    errors = []

    def send():
        try:
            journal.signal(run_id, "go", "x", signal_id="same")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and Signal.objects.filter(run_id=run_id).count() == 1


def test_finished_runs_and_unknown_names_are_refused_clearly(drive):
    run_id = journal.start("wait-signal")
    with pytest.raises(journal.SignalError, match="declares: go"):
        journal.signal(run_id, "stop")
    with pytest.raises(journal.SignalError, match="non-empty name"):
        journal.signal(run_id, "")
    with pytest.raises(journal.SerializationError):
        journal.signal(run_id, "go", {"not": object()})
    with pytest.raises(journal.RunNotFoundError):
        journal.signal("00000000-0000-0000-0000-000000000000", "go")
    assert not Signal.objects.exists()
    journal.signal(run_id, "go")
    drive()
    with pytest.raises(journal.SignalError, match="completed"):
        journal.signal(run_id, "go")
    assert Signal.objects.count() == 1


def test_wait_timeout_is_a_clear_outcome(drive):
    run_id = journal.start("wait-signal", 0.2)
    drive()
    run = journal.get_run(run_id)
    assert run.status in (RunStatus.SUSPENDED, RunStatus.COMPLETED)
    if run.status == RunStatus.SUSPENDED:
        assert run.wake_at is not None
        import time

        time.sleep(0.3)
        drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"timed_out": True}
    # a late signal to a finished run is refused
    with pytest.raises(journal.SignalError):
        journal.signal(run_id, "go")
    assert Run.objects.filter(id=run_id, status=RunStatus.COMPLETED).exists()


def test_a_signal_sent_while_the_run_is_committing_its_suspension_is_not_lost(drive, monkeypatch):
    """The race behind lost wake-ups: the signal arrives after the suspension's inbox check but
    before its commit. The sender must wait for the row and then wake the run."""
    from journal.driver.executor import WAKE_CHECKS

    original = WAKE_CHECKS["signal"]
    senders: list[threading.Thread] = []

    def signal_during_commit(ctx, waiting_for, final):
        original(ctx, waiting_for, final)
        if not senders:
            def send():
                try:
                    journal.signal(ctx.run_id, "go", "raced")
                finally:
                    from django.db import connection

                    connection.close()

            t = threading.Thread(target=send)
            senders.append(t)
            t.start()
            t.join(timeout=1.0)  # it must not get through while our transaction is open

    monkeypatch.setitem(WAKE_CHECKS, "signal", signal_during_commit)
    run_id = journal.start("wait-signal")
    drive()
    senders[0].join(timeout=30)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.status
    assert run.output == {"payload": "raced"}
