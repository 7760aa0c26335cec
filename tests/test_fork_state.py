"""journal.fork(..., state=...): a fork whose workflow sees an edited explicit state from the fork step on.

The analogue of LangGraph's ``update_state`` on a past checkpoint, for native runs: steps before the
fork step replay from the parent, the step and everything after it run live on the edited state, and
every later execution of the fork (a resume, a replay check) sees the same edit.
"""

import pytest

import journal
from journal.engine.history import History
from journal.models import Checkpoint, EventKind, Run, RunStatus, SessionEvent
from journal.operations.timetravel import FORK_STATE, replay
from tests.agents import timetravel as agents

pytestmark = pytest.mark.django_db(transaction=True)

EDITED = {"total": 100, "seen": ["edited"]}


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    return tmp_path


def finished_parent(drive, n: int = 4) -> str:
    parent = journal.start("tt-state", n)  # add x n (steps 1..n), verdict (n + 1)
    drive()
    assert journal.get_run(parent).output == {"total": 10, "seen": [1, 2, 3, 4], "verdict": "approve"}
    return parent


def test_the_forked_workflow_sees_the_edited_state_and_the_steps_before_do_not_run_again(drive):
    parent = finished_parent(drive)
    # The stepper's state at step 3 is what step 3 ran with: the total of steps 1 and 2.
    assert journal.state_at(parent, 3).state == {"total": 3, "seen": [1, 2]}
    ran_before = len(agents.executed())

    child = journal.fork(parent, at_step=3, state=EDITED, actor="alice", reason="what if the total were 100")
    drive()
    run = journal.get_run(child)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"total": 107, "seen": ["edited", 3, 4], "verdict": "reject"}
    assert agents.executed()[ran_before:] == ["add 100 3", "add 103 4", "verdict 107"]  # 1 and 2 replayed
    assert journal.get_run(parent).output["total"] == 10  # the parent is untouched
    # The fork's stepper: the edit is the state step 3 started from; steps before it are the parent's.
    assert journal.state_at(child, 2).state == journal.state_at(parent, 2).state
    assert journal.state_at(child, 4).state == {"total": 103, "seen": ["edited", 3]}
    action = SessionEvent.objects.get(run_id=child, kind=EventKind.OPERATOR_ACTION)
    assert action.actor == "alice"
    assert action.payload | {"state": True, "override": False, "at_step": 3} == action.payload
    edit = Checkpoint.objects.get(run_id=child, step_name=FORK_STATE)
    assert (edit.position, edit.state) == (3, EDITED)


def test_a_state_fork_at_step_1_starts_from_the_edit(drive):
    parent = finished_parent(drive)
    child = journal.fork(parent, at_step=1, state={"total": 1000, "seen": []}, actor="alice")
    drive()
    assert journal.get_run(child).output == {"total": 1010, "seen": [1, 2, 3, 4], "verdict": "reject"}


def test_a_state_fork_resumes_deterministically_after_a_suspension(drive):
    """The fork suspends after the edited steps and is resumed by a new execution that replays from
    the top: the replayed steps' arguments (recorded from the edited state) must match again."""
    parent = journal.start("tt-state", 4, wait=True)
    drive()
    journal.signal(parent, "go", True)
    drive()
    assert journal.get_run(parent).status == RunStatus.COMPLETED
    child = journal.fork(parent, at_step=2, state={"total": 50, "seen": ["e"]}, actor="bob")
    drive()
    assert journal.get_run(child).status == RunStatus.SUSPENDED
    ran_before = len(agents.executed())
    journal.signal(child, "go", True)
    drive()
    run = journal.get_run(child)
    assert run.status == RunStatus.COMPLETED, (run.error, run.attention_reason)
    assert run.output == {"total": 59, "seen": ["e", 2, 3, 4], "verdict": "approve"}
    assert agents.executed()[ran_before:] == ["verdict 59"]  # the resumed execution replayed the edited steps
    check = journal.replay_check(child)
    assert check.ok, check.divergence
    # The journal as a value carries the edit: a golden copy replays clean too.
    history = History.from_json(History.load(Run.objects.get(id=child)).to_json())
    assert history.edited_state == {2: {"total": 50, "seen": ["e"]}}
    assert replay(history).ok


def test_without_the_edit_the_fork_journal_would_not_replay(drive):
    """The replay check really depends on the edit: the same journal without it diverges."""
    parent = finished_parent(drive)
    child = journal.fork(parent, at_step=3, state=EDITED, actor="alice")
    drive()
    history = History.load(Run.objects.get(id=child))
    history.edited_state = {}
    assert not replay(history).ok


def test_a_fork_of_a_state_fork_keeps_the_inherited_edit(drive):
    parent = finished_parent(drive)
    child = journal.fork(parent, at_step=3, state=EDITED, actor="alice")
    drive()
    grandchild = journal.fork(child, at_step=5, actor="alice")  # re-run the verdict: steps 3 and 4 replay
    drive()
    run = journal.get_run(grandchild)
    assert run.status == RunStatus.COMPLETED, (run.error, run.attention_reason)
    assert run.output == journal.get_run(child).output


def test_override_and_state_together(drive):
    parent = finished_parent(drive)
    ran_before = len(agents.executed())
    child = journal.fork(parent, at_step=3, override=50, state=EDITED, actor="alice")
    drive()
    assert journal.get_run(child).output == {"total": 54, "seen": ["edited", 3, 4], "verdict": "approve"}
    assert agents.executed()[ran_before:] == ["add 50 4", "verdict 54"]  # step 3 returned the override


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"at_step": 3, "state": "not a dict"}, "must be a JSON object"),
    ({"at_step": 3, "state": [1, 2]}, "must be a JSON object"),
    ({"at_step": 3, "state": {"x": float("nan")}}, "edited state"),
    ({"at_step": 3, "state": {"x": "nul\x00"}}, "edited state"),
    ({"at_step": 99, "state": {"x": 1}}, "positions 1..5"),
    ({"at_step": 0, "state": {"x": 1}}, "positions 1..5"),
])
def test_bad_input_is_refused_with_nothing_written(drive, kwargs, message):
    parent = finished_parent(drive)
    runs, events, checkpoints = Run.objects.count(), SessionEvent.objects.count(), Checkpoint.objects.count()
    with pytest.raises(journal.DurableError, match=message):
        journal.fork(parent, actor="alice", **kwargs)
    assert (Run.objects.count(), SessionEvent.objects.count(), Checkpoint.objects.count()) == (
        runs, events, checkpoints)
