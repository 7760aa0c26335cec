"""Child runs: own journals, durable waits, failures raised in the parent, bounded fan-out, cascading cancel."""

import pytest

import journal
from journal.models import EventKind, Run, RunStatus, SessionEvent
from tests.agents import waiting
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.waiting"



def test_child_result_returns_to_the_parent_which_waited_suspended(drive):
    run_id = journal.start("square-parent", 7)
    drive()
    parent = journal.get_run(run_id)
    assert parent.status == RunStatus.COMPLETED, parent.error
    assert parent.output == 50
    child = Run.objects.get(parent_id=run_id)
    assert child.agent == "square" and child.status == RunStatus.COMPLETED and child.output == 49
    kinds = list(SessionEvent.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert EventKind.CHILD_STARTED in kinds and EventKind.SUSPENDED in kinds
    started = SessionEvent.objects.get(run_id=run_id, kind=EventKind.CHILD_STARTED)
    assert started.payload["child_run_id"] == str(child.id) and started.position == 1
    assert waiting.lines() == ["square 7"]


def test_a_failed_child_raises_a_clear_error_in_the_parent(drive):
    run_id = journal.start("square-parent-catches", -3)
    drive()
    parent = journal.get_run(run_id)
    child = Run.objects.get(parent_id=run_id)
    assert child.status == RunStatus.FAILED
    assert parent.output["failed"] == "failed" and parent.output["child"] == str(child.id)
    assert "negative: -3" in parent.output["message"]

    uncaught = journal.start("square-parent", -1)
    drive()
    run = journal.get_run(uncaught)
    assert run.status == RunStatus.FAILED and run.error_type == "ChildRunError" and "negative: -1" in run.error


def test_map_children_bounds_concurrency_and_keeps_item_order(drive):
    items = [5, 1, 4, 2, 3, 0, 6, 9, 8, 7]
    run_id = journal.start("fan-out", items, 3)
    drive(concurrency=4)
    parent = journal.get_run(run_id)
    assert parent.status == RunStatus.COMPLETED, parent.error
    assert parent.output == [i * i for i in items]
    children = list(Run.objects.filter(parent_id=run_id).values("started_at", "finished_at"))
    assert len(children) == len(items)
    for c in children:  # when each child started running, at most 3 children were running (itself included)
        live = [o for o in children if o["started_at"] <= c["started_at"] < o["finished_at"]]
        assert len(live) <= 3
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.CHILD_STARTED).count() == len(items)
    assert sorted(waiting.lines()) == sorted([f"square {i}" for i in items] + [f"fan-out done {run_id}"])


def test_map_children_raises_the_first_failure_in_item_order(drive):
    run_id = journal.start("fan-out", [1, -2, 3, -4], 2)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and "negative: -2" in run.error
    assert Run.objects.filter(parent_id=run_id, status=RunStatus.COMPLETED).count() == 2


def test_cancelling_a_parent_cascades_to_its_live_children(drive):
    run_id = journal.start("parent-of-waiter")
    drive()
    child = Run.objects.get(parent_id=run_id)
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    assert child.status == RunStatus.SUSPENDED and child.waiting_for["kind"] == "signal"
    journal.cancel(run_id, reason="no longer needed", actor="ops")
    child.refresh_from_db()
    assert journal.get_run(run_id).status == RunStatus.CANCELLED
    assert child.status == RunStatus.CANCELLED and child.cancelled_by == "ops"
    assert "no longer needed" in child.cancel_reason


def test_cancelling_a_child_wakes_its_parent_with_an_error(drive):
    run_id = journal.start("parent-of-waiter")
    drive()
    child = Run.objects.get(parent_id=run_id)
    journal.cancel(child.id, reason="stop the child", actor="ops")
    drive()
    parent = journal.get_run(run_id)
    assert parent.status == RunStatus.FAILED and parent.error_type == "ChildRunError"
    assert "cancelled" in parent.error


def test_bad_child_arguments_start_nothing(drive):
    run_id = journal.start("child-bad-args")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "BadArgumentsError", run.error
    assert not Run.objects.filter(parent_id=run_id).exists()
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.CHILD_STARTED).exists()


def test_a_crash_right_after_starting_a_child_does_not_start_a_second_one(tmp_path, worker_env, spawn_worker):
    """SIGKILL right after the commit that recorded the child_started marker (and created the child)."""
    run_id = journal.start("square-parent", 4)
    env = worker_env(AGENTS, DURABLE_FAULTS="after_commit:position=1")
    first = spawn_worker(env)
    assert first.wait(timeout=60) == -9
    assert Run.objects.filter(parent_id=run_id).count() == 1
    second = spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=60)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == 17
    assert Run.objects.filter(parent_id=run_id).count() == 1
    assert waiting.lines() == ["square 4"]


def test_a_fan_out_whose_worker_died_with_its_group_full_is_finished_by_the_next(tmp_path, worker_env, spawn_worker):
    """SIGKILL the worker while a limit-2 group runs two slow children: the next worker takes them back
    (their group is full of them) and the fan-out finishes. Before, no claim took them: it never did."""
    run_id = journal.start("slow-fan-out", [1, 2, 3], 2)
    env = worker_env(AGENTS, DURABLE_LEASE_SECONDS="30")
    first = spawn_worker(env, "--concurrency", "4")
    wait_for(lambda: Run.objects.filter(parent_id=run_id, status=RunStatus.RUNNING).count() == 2
             and len(waiting.lines()) >= 2, timeout=60, message="two children in their steps")
    first.kill()
    second = spawn_worker(env, "--concurrency", "4")
    run = journal.wait(run_id, timeout=60)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error)
    assert run.output == [2, 4, 6]
    children = Run.objects.filter(parent_id=run_id)
    assert children.count() == 3 and all(c.status == RunStatus.COMPLETED for c in children)
