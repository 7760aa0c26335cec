"""The one owner of a run's status: every move the table forbids is refused and changes nothing."""

from __future__ import annotations

import itertools

import pytest
from django.forms.models import model_to_dict

from journal.models import EventKind, Run, RunStatus, SessionEvent
from journal.store import runstate
from journal.store.runstate import MOVES, Cause, RefusedMove

pytestmark = pytest.mark.django_db

STATUSES = list(RunStatus)


def _run(status: str) -> Run:
    return Run.objects.create(agent="table-walk", status=status, input={"args": [], "kwargs": {}})


def _row(run: Run) -> dict:
    return model_to_dict(Run.objects.get(id=run.id), exclude=["updated_at"])


@pytest.mark.parametrize("cause", list(Cause))
def test_every_forbidden_move_is_refused_and_leaves_the_run_as_it_was(cause):
    forbidden = [(s, t) for s, t in itertools.product(STATUSES, STATUSES) if cause not in MOVES.get((s, t), ())]
    assert forbidden, "a cause that may make every move would be no rule at all"
    for source, target in forbidden:
        run = _run(source)
        before = _row(run)
        with pytest.raises(RefusedMove, match=f"from {source} to {target}"):
            runstate.move(run.id, target, cause=cause, sources=(source,), error="must not be written",
                          event=EventKind.LOG, payload={"message": "must not be written"})
        assert _row(run) == before, (source, target, cause)
        assert not SessionEvent.objects.filter(run_id=run.id).exists()


def test_every_allowed_move_happens_once_with_its_event():
    for (source, target), causes in MOVES.items():
        for cause in causes:
            run = _run(source)
            assert runstate.move(run.id, target, cause=cause, sources=(source,), event=EventKind.LOG,
                                 payload={"message": f"{source}->{target}"}, actor="table")
            assert Run.objects.get(id=run.id).status == target
            event = SessionEvent.objects.get(run_id=run.id)
            assert (event.seq, event.actor, event.payload["message"]) == (1, "table", f"{source}->{target}")


def test_a_move_from_a_status_the_run_has_left_changes_nothing():
    run = _run(RunStatus.COMPLETED)
    before = _row(run)
    assert not runstate.wake(run.id)  # suspended -> pending is allowed, but this run is not suspended
    assert not runstate.move(run.id, RunStatus.PENDING, cause=Cause.OPERATOR, sources=(RunStatus.FAILED,),
                             event=EventKind.LOG, payload={})
    assert _row(run) == before
    assert not SessionEvent.objects.filter(run_id=run.id).exists()


def test_a_fenced_move_by_a_worker_that_lost_its_claim_is_refused():
    run = _run(RunStatus.RUNNING)
    Run.objects.filter(id=run.id).update(epoch=5)
    with pytest.raises(runstate.LeaseLost):
        runstate.move_fenced(run.id, 4, RunStatus.COMPLETED, cause=Cause.SETTLE, sources=(RunStatus.RUNNING,))
    assert Run.objects.get(id=run.id).status == RunStatus.RUNNING


def test_the_status_sets_are_the_tables_summaries():
    assert runstate.TERMINAL.isdisjoint(runstate.LIVE)
    assert runstate.TERMINAL | {RunStatus.NEEDS_ATTENTION} == runstate.STOPPED
    # Nothing leaves a terminal status but retry and compensation, which an operator (or the saga) asks for.
    for (source, _target), causes in MOVES.items():
        if source in runstate.TERMINAL:
            assert causes <= {Cause.OPERATOR, Cause.SAGA}, (source, causes)
    for status in runstate.COMPENSABLE:
        assert runstate.allowed(status, RunStatus.COMPENSATING, Cause.OPERATOR)
