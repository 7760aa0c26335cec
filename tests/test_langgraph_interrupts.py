"""A graph's interrupt() is a durable-ui approval: the run suspends (no thread held), the approval
is in the inbox, and deciding it resumes the graph with the decision as interrupt()'s value."""

from collections import Counter

import pytest

import journal
from journal.contrib.langgraph import start
from journal.models import Approval, RunStatus
from journal.operations.approvals import pending_approvals
from tests.agents import langgraph_crashy

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting(run_id) -> Approval:
    run = journal.get_run(run_id)
    assert run.status == RunStatus.SUSPENDED, (run.status, run.error)
    assert run.waiting_for["kind"] == "approval"
    return Approval.objects.get(id=run.waiting_for["approval_id"])


def test_each_interrupt_waits_in_the_inbox_and_the_decisions_resume_the_graph(drive):
    run_id = start("lg-refund", {"order": "A-7"})
    drive()
    first = _waiting(run_id)
    assert first.prompt == "manager: send 'refund order A-7'?"
    assert first.context["value"] == {"question": "manager: send 'refund order A-7'?", "draft": "refund order A-7"}
    assert list(pending_approvals()) == [first]

    journal.decide(first.id, approved=True, actor="alice", edited="refund order A-7 (50%)")
    drive()
    second = _waiting(run_id)  # the next interrupt, not the first one answered again
    assert second.id != first.id and second.prompt == "finance: send 'refund order A-7 (50%)'?"

    journal.decide(second.id, approved=True, actor="bob")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["sent"] == "refund order A-7 (50%)"
    assert run.output["verdicts"] == ["manager approved (alice)", "finance approved (bob)"]
    counts = Counter(langgraph_crashy.executions())
    assert counts == {"draft": 1, "reviewed by manager": 1, "reviewed by finance": 1, "send": 1}, counts
    assert not pending_approvals().exists()


def test_a_rejection_is_what_interrupt_returns(drive):
    run_id = start("lg-refund", {"order": "B-2"})
    drive()
    journal.decide(_waiting(run_id).id, approved=False, actor="carol", comment="no")
    drive()
    journal.decide(_waiting(run_id).id, approved=True, actor="dave")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["sent"] == "" and run.output["verdicts"] == ["manager rejected", "finance approved (dave)"]
