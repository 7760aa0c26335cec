"""Approvals: first-class records with role, quorum and expiry; decide() refuses cleanly; the run resumes."""

import time

import pytest

import journal
from journal.approvals import (
    ApprovalClosedError,
    ApprovalExpired,
    ApprovalNotFoundError,
    ApprovalPermissionError,
    DuplicateVoteError,
    pending_approvals,
)
from journal.models import Approval, ApprovalDecision, ApprovalStatus, EventKind, RunStatus, SessionEvent
from tests.agents import waiting

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _log_dir(tmp_path, monkeypatch):
    """The agents' execution log goes to this test's directory (worker processes get the same one)."""
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))


def _suspended_approval(drive, **kwargs):
    run_id = journal.start("approve-me", **kwargs)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.SUSPENDED, run.error
    assert run.waiting_for["kind"] == "approval"
    return run_id, Approval.objects.get(id=run.waiting_for["approval_id"])


def test_approval_records_the_request_and_resumes_with_who_decided(drive):
    run_id, approval = _suspended_approval(drive, prompt="deploy v2?")
    assert approval.prompt == "deploy v2?" and approval.role == "operator" and approval.quorum == 1
    assert approval.context == {"diff": "<b>+1 line</b>"}
    assert list(pending_approvals()) == [approval]
    assert journal.get_run(run_id).waiting_for["position"] == approval.position == 1

    journal.decide(approval.id, approved=True, actor="alice", comment="looks fine", edited={"v": 2})
    assert journal.get_run(run_id).status == RunStatus.PENDING  # woken in the decision's transaction
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["approved"] is True and run.output["decided_by"] == ["alice"]
    assert run.output["comment"] == "looks fine" and run.output["edited"] == {"v": 2}
    decided = SessionEvent.objects.get(run_id=run_id, kind=EventKind.APPROVAL_DECIDED)
    assert decided.actor == "alice" and decided.position == 1
    assert waiting.lines() == [f"decided {run_id} approved"]
    assert not pending_approvals().exists()


def test_quorum_needs_distinct_people_and_refuses_a_second_vote(drive):
    run_id, approval = _suspended_approval(drive, quorum=2)
    journal.decide(approval.id, approved=True, actor="alice")
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED  # 1 of 2
    with pytest.raises(DuplicateVoteError):
        journal.decide(approval.id, approved=True, actor="alice")
    assert ApprovalDecision.objects.filter(approval=approval).count() == 1
    journal.decide(approval.id, approved=True, actor="bob")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output["decided_by"] == ["alice", "bob"]


def test_one_rejection_decides(drive):
    run_id, approval = _suspended_approval(drive, quorum=3)
    journal.decide(approval.id, approved=True, actor="alice")
    journal.decide(approval.id, approved=False, actor="bob", comment="not on a Friday")
    drive()
    run = journal.get_run(run_id)
    assert run.output["approved"] is False and run.output["status"] == "rejected"
    assert run.output["decided_by"] == ["bob"] and run.output["comment"] == "not on a Friday"


def test_decide_refuses_wrong_role_closed_and_unknown_approvals_recording_nothing(drive):
    run_id, approval = _suspended_approval(drive, role="finance")
    with pytest.raises(ApprovalPermissionError):
        journal.decide(approval.id, approved=True, actor="eve", actor_roles={"operator"})
    assert not ApprovalDecision.objects.exists()
    journal.decide(approval.id, approved=True, actor="root", actor_roles={"admin"})  # admin may always decide
    with pytest.raises(ApprovalClosedError):
        journal.decide(approval.id, approved=False, actor="carol")
    with pytest.raises(ApprovalNotFoundError):
        journal.decide("not-a-uuid", approved=True, actor="carol")
    assert ApprovalDecision.objects.count() == 1
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED


def test_expiry_rejects_by_default_and_refuses_late_votes(drive):
    run_id, approval = _suspended_approval(drive, timeout=0.5)
    assert journal.get_run(run_id).wake_at == approval.expires_at
    time.sleep(0.6)
    with pytest.raises(ApprovalClosedError):
        journal.decide(approval.id, approved=True, actor="late")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED
    assert run.output["status"] == "expired" and run.output["approved"] is False
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.EXPIRED


def test_expiry_can_fail_the_run(drive):
    run_id, _ = _suspended_approval(drive, timeout=0.3, on_expiry="fail")
    time.sleep(0.4)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.error_type == ApprovalExpired.__name__


def test_expiry_can_escalate_to_another_role(drive):
    run_id, approval = _suspended_approval(drive, timeout=0.3, on_expiry="escalate:admin")
    time.sleep(0.4)
    drive()
    approval.refresh_from_db()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.SUSPENDED and run.waiting_for["role"] == "admin"
    assert approval.status == ApprovalStatus.ESCALATED and approval.role == "admin"
    with pytest.raises(ApprovalPermissionError):
        journal.decide(approval.id, approved=True, actor="op", actor_roles={"operator"})
    journal.decide(approval.id, approved=True, actor="boss", actor_roles={"admin"})
    drive()
    assert journal.get_run(run_id).output["decided_by"] == ["boss"]


def test_decision_made_before_the_run_finished_suspending_is_not_lost(drive, monkeypatch):
    """The suspension's transaction re-checks the approval: a decision that raced it wakes the run."""
    from journal import approvals

    original = approvals._expire_if_due
    raced = []

    def decide_meanwhile(approval, now=None):
        checked = original(approval, now)
        if not raced:  # someone decides between the workflow's check and its suspension commit
            raced.append(journal.decide(approval.id, approved=True, actor="quick"))
        return checked

    monkeypatch.setattr(approvals, "_expire_if_due", decide_meanwhile)
    run_id = journal.start("approve-me")
    drive()
    run = journal.get_run(run_id)
    assert raced and run.status == RunStatus.COMPLETED, run.status
    assert run.output["decided_by"] == ["quick"]
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.SUSPENDED).count() == 1


def test_bad_approval_requests_fail_the_run_with_a_clear_error(drive):
    run_id = journal.start("approve-me", on_expiry="explode")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED and "on_expiry" in run.error
    assert not Approval.objects.exists()
