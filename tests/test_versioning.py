"""Versioning: a run resumed on changed code is replay-checked first; ctx.patched() branches per run."""

import pytest

import journal
from journal.engine import registry
from journal.models import EventKind, Run, RunStatus, SessionEvent
from tests.agents import timetravel as agents
from tests.agents.timetravel import add, swap_code, verdict

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    return tmp_path


# Changed versions of tt-wait (add x n, wait for "go", add).
def waits_diverging(ctx, n):
    total = 0
    for i in range(1, n + 1):
        if i == 2:
            verdict(total)  # a new call in the middle of the recorded prefix
        total = add(total, i)
    extra = ctx.wait_for_signal("go")
    return {"total": add(total, extra)}


def waits_compatible(ctx, n):
    total = sum_so_far = 0
    for i in range(n):
        sum_so_far = add(total, i + 1)
        total = sum_so_far
    return {"total": add(total, ctx.wait_for_signal("go")), "v": 2}


def test_resume_on_divergent_code_goes_to_needs_attention_not_mis_replayed(drive):
    run_id = journal.start("tt-wait", 3)
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    executed = agents.executed()
    swap_code("tt-wait", waits_diverging)
    journal.signal(run_id, "go", 10)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "step 2" in run.attention_reason and "verdict" in run.attention_reason
    event = SessionEvent.objects.get(run_id=run_id, kind=EventKind.NONDETERMINISM)
    assert event.payload["position"] == 2
    assert agents.executed() == executed  # nothing ran on the new code
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, position__gt=3).exists()

    # The operator deploys compatible code and resumes it.
    swap_code("tt-wait", waits_compatible)
    journal.resume(run_id, actor="alice", reason="hotfix deployed")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output == {"total": 16, "v": 2}
    assert run.fingerprint == registry.get_workflow("tt-wait").fingerprint


def test_resume_on_compatible_code_continues_and_records_the_check(drive):
    run_id = journal.start("tt-wait", 2)
    drive()
    old = journal.get_run(run_id).fingerprint
    swap_code("tt-wait", waits_compatible)
    journal.signal(run_id, "go", 1)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"total": 4, "v": 2}
    assert run.fingerprint != old
    log = SessionEvent.objects.get(run_id=run_id, kind=EventKind.LOG, payload__from_fingerprint=old)
    assert "compatible" in log.payload["message"]
    assert agents.executed() == ["add 0 1", "add 1 2", "add 3 1"]


# A workflow that changes while runs are in flight, branching with ctx.patched().
def versioned_v1(ctx):
    a = add(0, 1)
    ctx.wait_for_signal("go")
    b = add(a, 2)
    ctx.wait_for_signal("go2")
    return {"b": b, "patched": None}


def versioned_v2(ctx):
    a = add(0, 1)
    ctx.wait_for_signal("go")
    bonus = ctx.patched("bonus")
    b = add(a, 20 if bonus else 2)
    ctx.wait_for_signal("go2")
    return {"b": b, "patched": bonus}


@pytest.fixture
def versioned():
    registry.register_workflow(registry.WorkflowDef(
        name="tt-versioned", fn=versioned_v1, fingerprint=registry.code_fingerprint(versioned_v1),
        module=__name__))
    return "tt-versioned"


def test_patched_keeps_old_runs_on_the_old_path_and_new_ones_on_the_new(drive, versioned):
    passed = journal.start(versioned)  # will pass the patch point on v1
    waiting = journal.start(versioned)  # will wait before the patch point when v2 is deployed
    drive()
    journal.signal(passed, "go", 1)
    drive()
    assert journal.get_run(passed).status == journal.get_run(waiting).status == RunStatus.SUSPENDED

    swap_code(versioned, versioned_v2)
    fresh = journal.start(versioned)
    for run_id in (passed, waiting, fresh):
        journal.signal(run_id, "go", 1)
        journal.signal(run_id, "go2", 1)
    drive()
    outputs = {run_id: journal.get_run(run_id).output for run_id in (passed, waiting, fresh)}
    assert outputs == {passed: {"b": 3, "patched": False}, waiting: {"b": 21, "patched": True},
                       fresh: {"b": 21, "patched": True}}
    marker = SessionEvent.objects.get(run_id=waiting, step_name="patch:bonus")
    assert marker.position == 3 and marker.payload["result"] is True
    assert not SessionEvent.objects.filter(run_id=passed, step_name="patch:bonus").exists()
    for run_id in (passed, waiting, fresh):  # every journal replays on the new code
        assert journal.replay_check(run_id).ok
    # Removing the call while journals hold its marker is reported, not mis-replayed.
    swap_code(versioned, versioned_v1)
    check = journal.replay_check(waiting)
    assert (check.ok, check.divergence.position, check.divergence.expected) == (False, 3, "patch:bonus")
    assert journal.replay_check(passed).divergence.detail == "same calls, different output"  # patched: None


def test_patched_needs_a_change_id(drive, versioned):
    def bad(ctx):
        return ctx.patched("")

    swap_code(versioned, bad)
    run_id = journal.start(versioned)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and "change id" in run.error
    assert Run.objects.filter(id=run_id).exists()
