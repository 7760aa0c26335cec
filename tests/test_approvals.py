"""Approvals: first-class records with role, quorum and expiry; decide() refuses cleanly; the run resumes."""

import time

import pytest

import journal
from journal.models import Approval, ApprovalDecision, ApprovalStatus, EventKind, RunStatus, SessionEvent
from journal.operations.approvals import (
    ApprovalClosedError,
    ApprovalNotFoundError,
    ApprovalPermissionError,
    DuplicateVoteError,
    pending_approvals,
)
from journal.primitives.approvals import ApprovalExpired
from tests.agents import waiting
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)



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
    from journal.primitives import approvals

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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebProcess:
    """A real `manage.py runserver` process serving the HTTP API (killed like the workers)."""

    def __init__(self, env: dict, log_path):
        import subprocess
        import sys

        from tests.conftest import ROOT

        self.port = _free_port()
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "runserver", f"127.0.0.1:{self.port}", "--noreload",
                 "--skip-checks"], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.log_path = log_path
        wait_for(self._up, timeout=60, message="the web server to listen")

    def _up(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def call(self, method: str, path: str, secret: str, body=None) -> tuple[int, object]:
        import json
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {secret}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read())

    def kill(self) -> None:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def test_a_run_waiting_for_approval_survives_killing_every_process_then_api_approval_resumes_it(
        tmp_path, worker_env, spawn_worker):
    from runs.models import ApiToken

    _, secret = ApiToken.issue("release-bot", ["runs:read", "approvals:decide"], roles=["operator"])
    env = worker_env("tests.agents.waiting")
    web = WebProcess(env, tmp_path / "web-0.log")
    worker = spawn_worker(env)
    run_id = journal.start("approve-me", prompt="release 2.0?", timeout=3600)
    wait_for(lambda: journal.get_run(run_id).status == RunStatus.SUSPENDED, timeout=60, message="the approval wait")
    status, listed = web.call("GET", "/api/approvals", secret)
    assert status == 200 and [a["run_id"] for a in listed] == [run_id]

    worker.kill()  # every process dies: the worker and the web server
    web.kill()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED

    worker = spawn_worker(env)  # everything restarts
    web = WebProcess(env, tmp_path / "web-1.log")
    try:
        status, listed = web.call("GET", "/api/approvals", secret)
        assert status == 200 and listed[0]["prompt"] == "release 2.0?"
        status, body = web.call("POST", f"/api/approvals/{listed[0]['approval_id']}/decision", secret,
                                {"approved": True, "comment": "go"})
        assert status == 200 and body["status"] == "approved", body
        run = journal.wait(run_id, timeout=60)
    finally:
        web.kill()
    assert worker.terminate() == 0, worker.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["decided_by"] == ["token:release-bot"] and run.output["comment"] == "go"
    assert waiting.lines() == [f"decided {run_id} approved"]
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.APPROVAL_REQUESTED).count() == 1


def test_approvals_of_a_cancelled_run_leave_the_inbox_and_cannot_be_decided(drive):
    run_id, approval = _suspended_approval(drive)
    journal.cancel(run_id, reason="obsolete", actor="ops")
    assert not pending_approvals().exists()
    with pytest.raises(ApprovalClosedError, match="cancelled"):
        journal.decide(approval.id, approved=True, actor="alice")
    assert not ApprovalDecision.objects.exists()
