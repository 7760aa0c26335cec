"""@journal.step(atomic=True): the step's writes and its journal record commit together, so a write
to the application's own database is exactly-once outright, through crashes and retries."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

import journal
from journal.models import EventKind, RunStatus, SessionEvent
from tests.agents import atomic

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.atomic"


def test_an_atomic_step_writes_once_and_replays_from_its_record(drive):
    run_id = journal.start("atomic-users", ["ada", "bob", "cy"])
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert sorted(User.objects.values_list("username", flat=True)) == ["ada", "bob", "cy"]
    assert run.output == list(User.objects.order_by("id").values_list("id", flat=True))
    record = SessionEvent.objects.steps().get(run_id=run_id, position=2)
    assert record.payload["atomic"] is True
    check = journal.replay_check(run_id)
    assert check.ok and check.checked == 3
    assert atomic.executions() == ["add ada", "add bob", "add cy"]


def test_a_failed_attempt_rolls_its_writes_back_before_the_retry(drive):
    run_id = journal.start("atomic-flaky", "dee")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert User.objects.filter(username="dee").count() == 1  # the first attempt's row was rolled back
    assert atomic.executions() == ["flaky dee", "flaky dee"]
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_FAILED).count() == 1


def test_a_crash_before_the_commit_leaves_neither_the_write_nor_the_record(worker_env, spawn_worker):
    run_id = journal.start("atomic-users", ["ada", "bob", "cy"])
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="atomic_before_commit:position=2"))
    assert first.wait(timeout=60) == -9  # SIGKILLed inside step 2's transaction
    assert list(User.objects.values_list("username", flat=True)) == ["ada"]
    assert not SessionEvent.objects.steps().filter(run_id=run_id, position=2).exists()
    second = spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=60)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert sorted(User.objects.values_list("username", flat=True)) == ["ada", "bob", "cy"]
    assert atomic.executions() == ["add ada", "add bob", "add bob", "add cy"]  # bob's first write never happened


def test_killed_inside_the_step_after_its_write_leaves_exactly_one_row_after_recovery(worker_env, spawn_worker):
    run_id = journal.start("atomic-users", ["ada", "bob", "cy"])
    first = spawn_worker(worker_env(AGENTS, ATOMIC_KILL_AFTER_WRITE="bob"))
    assert first.wait(timeout=60) == -9  # SIGKILLed inside add_user("bob"), after User.objects.create
    second = spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=60)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, (run.status, run.attention_reason)
    assert User.objects.filter(username="bob").count() == 1
    assert sorted(User.objects.values_list("username", flat=True)) == ["ada", "bob", "cy"]


def test_a_crash_after_the_commit_replays_the_step(worker_env, spawn_worker):
    run_id = journal.start("atomic-users", ["ada", "bob", "cy"])
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="atomic_committed:position=2"))
    assert first.wait(timeout=60) == -9
    assert sorted(User.objects.values_list("username", flat=True)) == ["ada", "bob"]
    second = spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=60)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert User.objects.count() == 3
    assert atomic.executions() == ["add ada", "add bob", "add cy"]  # bob replayed from its record


def _write(*, idempotency_key: str = "") -> None:
    """A module-level function to decorate (nested ones are refused first)."""


@pytest.mark.parametrize("options, message", [
    ({"effect": True}, "exclude each other"),
    ({"durability": "exit"}, "cannot apply"),
    ({"using": "nowhere"}, "no database named"),
    ({"using": "analytics"}, "one transaction cannot span two databases"),
])
def test_an_atomic_step_that_cannot_hold_is_refused_at_decoration(options, message, monkeypatch):
    from journal.primitives import decorators

    class TwoDatabases:
        settings = {"default": {}, "analytics": {}}

    monkeypatch.setattr(decorators, "connections", TwoDatabases())
    with pytest.raises(journal.WorkflowDefinitionError, match=message):
        journal.step(atomic=True, **options)(_write)


def test_using_without_atomic_is_refused():
    with pytest.raises(journal.WorkflowDefinitionError, match="atomic steps only"):
        journal.step(using="default")(_write)
