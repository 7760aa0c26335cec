"""Durable timers: a sleeping run holds no thread; a timer that came due while no worker ran fires exactly once."""

import time

import pytest

import journal
from journal.models import EventKind, RunStatus, SessionEvent
from tests.agents import waiting
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.waiting"



def test_sleep_suspends_with_a_wake_time_and_the_worker_wakes_it(drive):
    run_id = journal.start("sleeper", 0.5)
    drive()
    run = journal.get_run(run_id)
    if run.status == RunStatus.SUSPENDED:  # (a busy machine may already be past the due time)
        assert run.waiting_for["kind"] == "timer" and run.wake_at is not None and run.lease_owner == ""
        time.sleep(max(0.0, (run.wake_at - run.created_at).total_seconds()))
        wait_for(lambda: journal.get_run(run_id).wake_at is None or time.time() > run.wake_at.timestamp(),
                 message="the timer to come due")
        drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert waiting.lines() == [f"fired {run_id}"]
    timer = SessionEvent.objects.get(run_id=run_id, kind=EventKind.STEP_COMPLETED, step_name="sleep")
    assert timer.payload["kind"] == "timer" and timer.payload["fired_at"] >= timer.payload["due"]


def test_a_timer_due_while_no_worker_ran_fires_exactly_once_at_start_up(tmp_path, worker_env, spawn_worker):
    """Suspend on a 2 s timer, kill every worker, let it come due, then start two worker processes at once."""
    run_id = journal.start("sleeper", 2.0)
    env = worker_env(AGENTS)
    first = spawn_worker(env)
    wait_for(lambda: journal.get_run(run_id).status == RunStatus.SUSPENDED, timeout=60, message="suspension")
    first.kill()  # everything is down
    run = journal.get_run(run_id)
    assert run.waiting_for["kind"] == "timer"
    while time.time() < run.wake_at.timestamp() + 0.5:  # the timer comes due while nothing runs
        time.sleep(0.1)
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    workers = [spawn_worker(env), spawn_worker(env)]  # racing at start-up: the lease lets one fire it
    run = journal.wait(run_id, timeout=60)
    for w in workers:
        assert w.terminate() == 0, w.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert waiting.lines() == [f"fired {run_id}"]
    fired = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, step_name="sleep")
    assert fired.count() == 1
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.TIMER_STARTED).count() == 1


def test_sleep_until_a_past_moment_continues_at_once(drive):
    run_id = journal.start("sleeper", 0)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.SUSPENDED).exists()
