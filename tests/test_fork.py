"""journal.fork: a new run reuses the parent's prefix, optionally with a what-if result, and goes on live."""

import pytest

import journal
from journal.models import Checkpoint, EffectStatus, EventKind, Run, RunStatus, SessionEvent, SideEffect
from tests.agents import timetravel as agents

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    return tmp_path


def steps(run_id) -> dict[int, tuple]:
    rows = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).order_by("seq")
    return {e.position: (e.step_name, e.payload) for e in rows}


def snapshot(run_id) -> tuple:
    run = Run.objects.filter(id=run_id).values().get()
    run.pop("updated_at")
    events = list(SessionEvent.objects.filter(run_id=run_id).order_by("seq").values())
    effects = list(SideEffect.objects.filter(run_id=run_id).values())
    checkpoints = list(Checkpoint.objects.filter(run_id=run_id).values())
    return run, events, effects, checkpoints


def test_fork_reuses_the_prefix_and_continues_live(drive):
    parent = journal.start("tt-pipeline", 5)  # add x5 (steps 1-5), verdict (6), send (7)
    drive()
    assert journal.get_run(parent).status == RunStatus.COMPLETED
    before = snapshot(parent)
    ran_before = len(agents.executed())

    child = journal.fork(parent, at_step=4, actor="alice", reason="step 4 looked wrong")
    drive()
    run = journal.get_run(child)
    assert run.status == RunStatus.COMPLETED
    assert run.output == journal.get_run(parent).output
    assert run.forked_from_id == Run.objects.get(id=parent).id and run.fork_step == 4
    parent_steps, child_steps = steps(parent), steps(child)
    assert {p: child_steps[p] for p in (1, 2, 3)} == {p: parent_steps[p] for p in (1, 2, 3)}
    # From step 4 on it executed live: the steps ran again, and the effect under the fork's own key.
    assert agents.executed()[ran_before:] == ["add 6 4", "add 10 5", "verdict 15", f"send approve:15 {child}:7"]
    assert child_steps[7][1]["idempotency_key"] == f"{child}:7" != parent_steps[7][1]["idempotency_key"]
    assert snapshot(parent) == before  # the parent is untouched
    action = SessionEvent.objects.get(run_id=child, kind=EventKind.OPERATOR_ACTION)
    assert (action.actor, action.payload["action"], action.payload["reason"]) == ("alice", "fork",
                                                                                   "step 4 looked wrong")


def test_fork_with_an_override_is_a_what_if(drive):
    parent = journal.start("tt-pipeline", 3)  # add x3, verdict (4), send (5)
    drive()
    before = snapshot(parent)
    ran_before = len(agents.executed())
    child = journal.fork(parent, at_step=4, override={"verdict": "reject"}, actor="bob")
    drive()
    run = journal.get_run(child)
    assert run.status == RunStatus.COMPLETED
    assert run.output == {"total": 6, "verdict": "reject", "sent": "reject:6"}
    assert journal.get_run(parent).output["verdict"] == "approve"
    assert agents.executed()[ran_before:] == [f"send reject:6 {child}:5"]  # the verdict step did not run
    child_steps, parent_steps = steps(child), steps(parent)
    assert {p: child_steps[p] for p in (1, 2, 3)} == {p: parent_steps[p] for p in (1, 2, 3)}
    assert child_steps[4][1]["result"] == {"verdict": "reject"} and child_steps[4][1]["overridden"] is True
    assert snapshot(parent) == before


def test_effects_before_the_fork_point_are_not_repeated(drive):
    parent = journal.start("tt-pay", 7)  # add (1), pay (2), add (3)
    drive()
    child = journal.fork(parent, at_step=3, actor="alice")
    drive()
    assert journal.get_run(child).status == RunStatus.COMPLETED
    assert [line for line in agents.executed() if line.startswith("pay")] == [f"pay 7 {parent}:2"]
    copied = SideEffect.objects.get(run_id=child, position=2)
    assert copied.status == EffectStatus.COMPLETED and copied.result == {"paid": 7}
    assert copied.idempotency_key == f"{child}:2"  # unique per run; the record keeps the key the world saw
    assert steps(child)[2][1]["idempotency_key"] == f"{parent}:2"


def test_fork_restores_the_sandbox_and_state_of_the_prefix(drive):
    from journal.engine.checkpoints import files_at, state_at_checkpoint
    from journal.engine.restore import sandbox_root

    parent = journal.start("tt-files")  # write (1), add (2), write (3), verdict (4), write (5), list (6)
    drive()
    assert journal.get_run(parent).output == {"files": ["approve.txt", "notes.txt", "sum.txt"],
                                              "verdict": "approve"}
    parent_files = {p.name: p.read_text() for p in sandbox_root(parent).iterdir()}
    child = journal.fork(parent, at_step=4, override={"verdict": "reject"}, actor="alice")
    drive()
    run = journal.get_run(child)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"files": ["notes.txt", "reject.txt", "sum.txt"], "verdict": "reject"}
    assert files_at(child, 3) == files_at(parent, 3) == {"notes.txt": b"start", "sum.txt": b"3"}
    assert state_at_checkpoint(child, 3) == state_at_checkpoint(parent, 3)
    assert {p.name: p.read_text() for p in sandbox_root(parent).iterdir()} == parent_files  # untouched


def test_fork_at_the_first_step_starts_from_an_empty_sandbox(drive):
    parent = journal.start("tt-files")
    drive()
    child = journal.fork(parent, at_step=1, actor="alice")
    drive()
    assert journal.get_run(child).output == journal.get_run(parent).output
    assert steps(child).keys() == steps(parent).keys()


@pytest.mark.parametrize("at_step", [0, -1, 4, 99, "2", 2.0, True, None])
def test_fork_out_of_range_is_refused_and_creates_nothing(drive, at_step):
    parent = journal.start("tt-pay", 1)  # 3 steps
    drive()
    runs = Run.objects.count()
    with pytest.raises(journal.BadArgumentsError, match="at_step|step"):
        journal.fork(parent, at_step=at_step, actor="alice")
    assert Run.objects.count() == runs


def test_fork_refuses_unknown_runs_and_bad_overrides(drive):
    with pytest.raises(journal.RunNotFoundError):
        journal.fork("00000000-0000-0000-0000-000000000000", at_step=1)
    parent = journal.start("tt-pay", 1)
    drive()
    runs = Run.objects.count()
    with pytest.raises(journal.SerializationError):
        journal.fork(parent, at_step=1, override={"when": object()})
    assert Run.objects.count() == runs


def test_overriding_an_effect_records_it_done_without_executing_it(drive):
    parent = journal.start("tt-pay", 5)  # add (1), pay (2), add (3)
    drive()
    child = journal.fork(parent, at_step=2, override={"paid": 99}, actor="alice")
    drive()
    run = journal.get_run(child)
    assert run.output == {"receipt": {"paid": 99}, "after": 6}
    assert [line for line in agents.executed() if line.startswith("pay")] == [f"pay 5 {parent}:2"]
    effect = SideEffect.objects.get(run_id=child, position=2)
    assert (effect.status, effect.result) == (EffectStatus.COMPLETED, {"paid": 99})
