"""Operator actions: pause/unpause, retry, resume, resolve an in-doubt effect; refusals change nothing."""

import threading
import time

import pytest
from django.utils import timezone

import journal
from journal.driver.worker import EmbeddedWorker
from journal.models import AgentPause, EffectStatus, EventKind, Run, RunStatus, SessionEvent, SideEffect
from tests.agents import timetravel as agents
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    return tmp_path


def actions(run_id) -> list[tuple]:
    return [(e.payload["action"], e.actor, e.payload.get("reason", "")) for e in
            SessionEvent.objects.filter(run_id=run_id, kind=EventKind.OPERATOR_ACTION).order_by("seq")]


def frozen(run_id) -> tuple:
    """Everything an action could change."""
    run = Run.objects.filter(id=run_id).values().get()
    run.pop("updated_at")
    return (run, SessionEvent.objects.filter(run_id=run_id).count(),
            list(SideEffect.objects.filter(run_id=run_id).values()))


def test_a_paused_run_holds_no_worker_until_unpaused(drive):
    run_id = journal.start("tt-pipeline", 2)
    journal.pause(run_id, actor="alice", reason="incident 42")
    drive()
    run = journal.get_run(run_id)
    assert (run.status, run.paused, run.steps) == (RunStatus.PENDING, True, 0)
    journal.unpause(run_id, actor="bob", reason="resolved")
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    assert actions(run_id) == [("pause", "alice", "incident 42"), ("unpause", "bob", "resolved")]


def test_a_running_run_is_released_at_the_next_step_boundary():
    run_id = journal.start("tt-slow", 120)  # 120 steps of 50 ms: it is running when paused
    worker = EmbeddedWorker(concurrency=1, poll_interval=0.02, ttl=3)
    thread = threading.Thread(target=worker.run, kwargs={"max_seconds": 120}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: Run.objects.filter(id=run_id, status=RunStatus.RUNNING).exists(), message="running")
        journal.pause(run_id, actor="alice", reason="freeze")
        wait_for(lambda: journal.get_run(run_id).status == RunStatus.PENDING, timeout=60, message="release")
        run = journal.get_run(run_id)
        assert run.paused and run.lease_owner == "" and run.steps < 120
        assert actions(run_id) == [("pause", "alice", "freeze")]  # recorded when the worker let go
        steps = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).count()
        time.sleep(1)  # the worker keeps polling: a paused run is not claimed again
        assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).count() == steps
        journal.unpause(run_id, actor="alice")
        wait_for(lambda: journal.get_run(run_id).status == RunStatus.COMPLETED, timeout=60, message="finish")
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    assert journal.get_run(run_id).output == sum(range(120))


def test_a_paused_suspended_run_keeps_its_signal_until_unpaused(drive):
    run_id = journal.start("tt-wait", 2)
    drive()
    journal.pause(run_id, actor="alice")
    journal.signal(run_id, "go", 5)
    drive()
    run = journal.get_run(run_id)
    assert run.paused and run.status in (RunStatus.PENDING, RunStatus.SUSPENDED) and run.output is None
    journal.unpause(run_id, actor="alice")
    drive()
    assert journal.get_run(run_id).output == {"total": 8}


def test_pause_and_unpause_every_run_of_an_agent(drive):
    runs = [journal.start("tt-pipeline", 1) for _ in range(3)]
    other = journal.start("tt-pay", 1)
    assert journal.pause_agent("tt-pipeline", actor="alice", reason="bad deploy") == 3
    drive()
    assert [journal.get_run(r).status for r in runs] == [RunStatus.PENDING] * 3
    assert journal.get_run(other).status == RunStatus.COMPLETED
    late = journal.start("tt-pipeline", 1)  # started during the freeze: it starts paused
    drive()
    assert journal.get_run(late).paused and journal.get_run(late).status == RunStatus.PENDING
    assert journal.unpause_agent("tt-pipeline", actor="alice") == 4
    drive()
    assert [journal.get_run(r).status for r in [*runs, late]] == [RunStatus.COMPLETED] * 4
    assert journal.start("tt-pipeline", 1) and not AgentPause.objects.exists()


def test_retry_a_failed_run_from_its_failure_point(drive, test_dir):
    outage = test_dir / "outage"
    outage.touch()
    run_id = journal.start("tt-flaky", str(outage))
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and "service unavailable" in run.error
    outage.unlink()
    journal.retry(run_id, actor="alice", reason="outage over")
    assert journal.get_run(run_id).error == ""
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"first": 3, "flaky": "ok"}
    assert agents.executed() == ["add 1 2"]  # the step before the failure replayed
    assert actions(run_id) == [("retry", "alice", "outage over")]


def in_doubt_run(worker_env, spawn_worker) -> str:
    """A real crash between executing an effect and recording it: the run needs attention."""
    run_id = journal.start("tt-pay", 7)  # add (1), pay (2), add (3)
    doomed = spawn_worker(worker_env("tests.agents.timetravel", DURABLE_FAULTS="effect_executed:position=2"))
    assert doomed.wait(timeout=120) == -9, doomed.log()
    wait_for(lambda: Run.objects.filter(id=run_id, lease_expires_at__lt=timezone.now()).exists(), timeout=30,
             message="the dead worker's lease to expire")
    EmbeddedWorker(concurrency=1, poll_interval=0.02).run(until_idle=True, max_seconds=60)
    run = journal.get_run(run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION, run.attention_reason
    assert SideEffect.objects.get(run_id=run_id, position=2).status == EffectStatus.STARTED
    return run_id


def pays() -> list[str]:
    return [line for line in agents.executed() if line.startswith("pay")]


@pytest.mark.parametrize("action", ["done", "skip", "retry"])
def test_resolve_an_in_doubt_effect(action, worker_env, spawn_worker, drive):
    run_id = in_doubt_run(worker_env, spawn_worker)
    assert len(pays()) == 1
    with pytest.raises(journal.RunStateError, match="in doubt"):
        journal.retry(run_id, actor="alice")
    result = {"paid": 7, "checked": "by phone"} if action == "done" else None
    journal.resolve_effect(run_id, 2, action=action, result=result, actor="alice", comment="checked the bank")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error or run.attention_reason
    effect = SideEffect.objects.get(run_id=run_id, position=2)
    assert effect.resolved_by == "alice"
    if action == "done":
        assert run.output["receipt"] == result and effect.status == EffectStatus.COMPLETED
        assert len(pays()) == 1
    elif action == "skip":
        assert run.output["receipt"] is None and effect.status == EffectStatus.SKIPPED
        assert len(pays()) == 1
    else:  # executed once more, under the same key
        assert run.output["receipt"] == {"paid": 7} and effect.status == EffectStatus.COMPLETED
        assert pays() == [f"pay 7 {run_id}:2"] * 2
    assert actions(run_id)[-1] == ("resolve_effect", "alice", "checked the bank")


def test_every_action_on_a_finished_run_is_refused_and_changes_nothing(drive):
    run_id = journal.start("tt-pay", 1)
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    before = frozen(run_id)
    refused = [
        lambda: journal.pause(run_id, actor="x"),
        lambda: journal.unpause(run_id, actor="x"),
        lambda: journal.retry(run_id, actor="x"),
        lambda: journal.resume(run_id, actor="x"),
        lambda: journal.resolve_effect(run_id, 2, action="done", result=1, actor="x"),
        lambda: journal.compensate(run_id, actor="x"),
        lambda: journal.cancel(run_id, reason="x", actor="x"),
    ]
    for act in refused:
        with pytest.raises(journal.RunStateError, match=str(run_id)):
            act()
        assert frozen(run_id) == before


def test_actions_in_the_wrong_state_are_refused_with_a_reason(drive):
    run_id = journal.start("tt-wait", 1)
    drive()
    before = frozen(run_id)
    with pytest.raises(journal.RunStateError, match="only a failed or needs_attention run can be retried"):
        journal.retry(run_id, actor="x")
    with pytest.raises(journal.RunStateError, match="only a needs_attention run can be resumed"):
        journal.resume(run_id, actor="x")
    with pytest.raises(journal.RunStateError, match="needs_attention"):
        journal.resolve_effect(run_id, 1, action="skip", actor="x")
    with pytest.raises(journal.RunStateError, match="not paused"):
        journal.unpause(run_id, actor="x")
    with pytest.raises(journal.BadArgumentsError, match="done, retry, skip"):
        journal.resolve_effect(run_id, 1, action="maybe", actor="x")
    with pytest.raises(journal.BadArgumentsError, match="only with action='done'"):
        journal.resolve_effect(run_id, 1, action="skip", result=3, actor="x")
    with pytest.raises(journal.RunNotFoundError):
        journal.pause("nope", actor="x")
    assert frozen(run_id) == before
    journal.pause(run_id, actor="x")
    with pytest.raises(journal.RunStateError, match="already paused"):
        journal.pause(run_id, actor="x")


def test_resolve_effect_refuses_a_step_that_is_not_an_in_doubt_effect(worker_env, spawn_worker):
    run_id = in_doubt_run(worker_env, spawn_worker)
    before = frozen(run_id)
    with pytest.raises(journal.RunStateError, match="step 1 is not an effect"):
        journal.resolve_effect(run_id, 1, action="skip", actor="x")
    assert frozen(run_id) == before


def test_pausing_a_run_whose_worker_died_takes_it_back_at_once(worker_env, spawn_worker, drive):
    run_id = journal.start("tt-slow", 60)
    worker = spawn_worker(worker_env("tests.agents.timetravel"))
    wait_for(lambda: Run.objects.filter(id=run_id, status=RunStatus.RUNNING, steps__gt=0).exists()
             or SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).exists(),
             timeout=60, message=f"the worker to start the run:\n{worker.log()}")
    worker.kill()
    epoch = journal.get_run(run_id).epoch
    wait_for(lambda: Run.objects.filter(id=run_id, lease_expires_at__lt=timezone.now()).exists(), timeout=30,
             message="the dead worker's lease to expire")
    journal.pause(run_id, actor="alice", reason="investigating")
    run = journal.get_run(run_id)
    assert (run.status, run.paused, run.lease_owner, run.epoch) == (RunStatus.PENDING, True, "", epoch + 1)
    assert actions(run_id) == [("pause", "alice", "investigating")]
    drive()
    assert journal.get_run(run_id).status == RunStatus.PENDING  # not recovered while paused
    journal.unpause(run_id, actor="alice")
    drive()
    assert journal.get_run(run_id).output == sum(range(60))
