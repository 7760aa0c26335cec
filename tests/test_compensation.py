"""Sagas: completed effects are undone in reverse order, each exactly once, also across SIGKILLs."""

import pytest

import journal
from journal.models import EffectStatus, EventKind, Run, RunStatus, SessionEvent, SideEffect
from tests.agents import saga
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS = ["flight", "hotel", "car", "dinner", "show"]


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    return tmp_path


def undone_items() -> list[str]:
    return [line.split()[0] for line in saga.lines("undone.log")]


def called_items() -> list[str]:
    return [line.split()[0] for line in saga.lines("calls.log")]


def test_saga_failing_at_the_fourth_effect_compensates_three_in_reverse_order(drive):
    run_id = journal.start("saga-trip", ITEMS, fail_at=4)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPENSATED, run.error
    assert "no seats left for dinner" in run.error
    assert saga.lines("booked.log") == ["flight", "hotel", "car", "dinner"]
    assert undone_items() == ["car", "hotel", "flight"]
    assert called_items() == ["car", "hotel", "flight"]
    keys = [line.split()[1] for line in saga.lines("undone.log")]
    assert keys == [f"{run_id}:{p}:compensate" for p in (3, 2, 1)]
    ledger = dict(SideEffect.objects.filter(run_id=run_id).values_list("position", "status"))
    assert ledger == {1: EffectStatus.COMPENSATED, 2: EffectStatus.COMPENSATED, 3: EffectStatus.COMPENSATED,
                      4: EffectStatus.FAILED}
    assert SideEffect.objects.get(run_id=run_id, position=1).compensation_result == {"refunded": "flight"}
    done = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.COMPENSATED, payload__scope="run").get()
    assert done.payload["compensated"] == 3


def test_a_run_without_failure_is_not_compensated(drive):
    run_id = journal.start("saga-trip", ITEMS[:2])
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    assert saga.lines("calls.log") == []


@pytest.mark.parametrize("point", ["compensation_started", "compensation_executed"])
def test_compensation_resumes_after_the_worker_is_sigkilled(point, worker_env, spawn_worker):
    """Kill the worker right after the intent of the second compensation is committed (before the
    call), or right after the call (before its result is committed): a new worker finishes the saga."""
    run_id = journal.start("saga-trip", ITEMS, fail_at=4)
    doomed = spawn_worker(worker_env("tests.agents.saga", DURABLE_FAULTS=f"{point}:position=2"))
    assert doomed.wait(timeout=120) == -9, doomed.log()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPENSATING
    assert undone_items() == (["car"] if point == "compensation_started" else ["car", "hotel"])

    rescuer = spawn_worker(worker_env("tests.agents.saga"))
    wait_for(lambda: journal.get_run(run_id).status == RunStatus.COMPENSATED, timeout=60,
             message=f"compensation to finish; worker log:\n{rescuer.log()}")
    rescuer.terminate()
    assert undone_items() == ["car", "hotel", "flight"]  # each applied exactly once, newest first
    if point == "compensation_started":
        assert called_items() == ["car", "hotel", "flight"]  # never called twice
    else:  # in doubt after the call: called again under the same key, which the outside system dedupes
        assert called_items() == ["car", "hotel", "hotel", "flight"]
        keys = [line.split()[1] for line in saga.lines("calls.log")]
        assert keys[1] == keys[2] == f"{run_id}:2:compensate"
    assert saga.lines("booked.log") == ["flight", "hotel", "car", "dinner"]  # no effect re-ran
    assert Run.objects.get(id=run_id).attempts >= 3  # the run, then the compensation, then its rescue


def test_operator_compensates_a_cancelled_run(drive):
    run_id = journal.start("saga-no-undo", ["a", "b"])
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    journal.cancel(run_id, reason="customer left", actor="ops")
    drive()
    assert journal.get_run(run_id).status == RunStatus.CANCELLED  # not opted in: cancel alone undoes nothing
    assert saga.lines("calls.log") == []
    journal.compensate(run_id, actor="alice", reason="refund the customer")
    assert journal.get_run(run_id).status == RunStatus.COMPENSATING
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPENSATED
    assert undone_items() == ["b", "a"]
    action = SessionEvent.objects.get(run_id=run_id, kind=EventKind.OPERATOR_ACTION, payload__action="compensate")
    assert action.actor == "alice" and action.payload["reason"] == "refund the customer"


def test_a_workflow_that_asks_for_it_is_compensated_on_cancel(drive):
    run_id = journal.start("saga-cancellable", ["a", "b", "c"])
    drive()
    journal.cancel(run_id, reason="changed plans", actor="ops")
    assert journal.get_run(run_id).status == RunStatus.COMPENSATING
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPENSATED
    assert undone_items() == ["c", "b", "a"]


def test_compensate_is_refused_for_wrong_states_and_changes_nothing(drive):
    done = journal.start("saga-trip", ["a"])
    waiting = journal.start("saga-no-undo", ["a"])
    drive()
    for run_id in (done, waiting):
        before = (journal.get_run(run_id).status, SessionEvent.objects.filter(run_id=run_id).count())
        with pytest.raises(journal.RunStateError, match="cannot compensate"):
            journal.compensate(run_id, actor="alice")
        assert (journal.get_run(run_id).status, SessionEvent.objects.filter(run_id=run_id).count()) == before
    journal.cancel(waiting, actor="ops")
    journal.compensate(waiting, actor="alice")
    drive()
    with pytest.raises(journal.RunStateError, match="compensated"):
        journal.compensate(waiting, actor="alice")  # already compensated
    assert undone_items() == ["a"]


def test_compensate_refuses_a_run_with_nothing_to_undo(drive):
    run_id = journal.start("saga-trip", ["a", "b"], fail_at=1)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED  # the only effect failed: nothing to undo
    with pytest.raises(journal.RunStateError, match="nothing to undo"):
        journal.compensate(run_id, actor="alice")
    assert journal.get_run(run_id).status == RunStatus.FAILED


def test_a_running_run_cancelled_at_a_step_boundary_is_compensated_when_its_workflow_asks():
    import threading

    from journal.driver.worker import EmbeddedWorker

    run_id = journal.start("saga-long", ["a", "b"])
    worker = EmbeddedWorker(concurrency=1, poll_interval=0.02, ttl=3)
    thread = threading.Thread(target=worker.run, kwargs={"max_seconds": 120}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(saga.lines("booked.log")) == 2, message="both bookings")
        journal.cancel(run_id, reason="trip called off", actor="ops")
        wait_for(lambda: journal.get_run(run_id).status == RunStatus.COMPENSATED, timeout=60,
                 message="cancel then compensation")
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    run = journal.get_run(run_id)
    assert "trip called off" in run.error
    assert undone_items() == ["b", "a"]
    kinds = list(SessionEvent.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))
    assert kinds.index(EventKind.RUN_CANCELLED) < kinds.index(EventKind.COMPENSATION_STARTED)


@pytest.mark.slow
def test_compensation_survives_a_kill_at_every_compensation(worker_env, spawn_worker):
    """Three workers die, one per compensation, at alternating points; the fourth finishes the saga."""
    run_id = journal.start("saga-trip", ITEMS, fail_at=4)
    for fault in ("compensation_started:position=3", "compensation_executed:position=2",
                  "compensation_started:position=1"):
        doomed = spawn_worker(worker_env("tests.agents.saga", DURABLE_FAULTS=fault))
        assert doomed.wait(timeout=120) == -9, doomed.log()
        assert journal.get_run(run_id).status == RunStatus.COMPENSATING
    rescuer = spawn_worker(worker_env("tests.agents.saga"))
    wait_for(lambda: journal.get_run(run_id).status == RunStatus.COMPENSATED, timeout=60,
             message=f"compensation to finish; worker log:\n{rescuer.log()}")
    rescuer.terminate()
    assert undone_items() == ["car", "hotel", "flight"]
    assert called_items() == ["car", "hotel", "hotel", "flight"]
    assert saga.lines("booked.log") == ["flight", "hotel", "car", "dinner"]
