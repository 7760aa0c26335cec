"""The contract review pipeline end to end: critic rounds, approvals, checkpoints, and SIGKILL-and-resume."""

from __future__ import annotations

import json
import random
import re
import threading

import pytest

import journal
from examples.contracts import portfolio
from examples.llm import demo_responder, system_tag
from examples.local_llm_server import LocalModelServer
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def contract_of(body: dict) -> str:
    text = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return re.search(r"C-\d{4}", text).group(0)


def outbox_lines(path) -> list[dict]:
    log = path / "outbox.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_portfolio_is_deterministic_and_sized():
    assert portfolio(500) == portfolio(500)
    assert len(portfolio(40)) == 40 and portfolio(40)[:10] == portfolio(500)[:10]
    assert portfolio(5, seed=1) != portfolio(5, seed=2)


def test_pipeline_drafts_criticises_escalates_and_checkpoints_each_contract(monkeypatch, tmp_path, drive):
    from journal.models import Checkpoint, Run, SessionEvent, SideEffect
    from journal.operations.approvals import decide

    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path))
    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)
    run_id = journal.start("contract_review", size=12)
    drive()
    decisions = []
    for _ in range(5):
        run = Run.objects.get(id=run_id)
        if run.status != "suspended":
            break
        assert run.waiting_for["kind"] == "approval"
        approved = not decisions  # approve the first high-risk contract, reject the next
        decide(run.waiting_for["approval_id"], approved=approved, actor="olga", comment="checked")
        decisions.append((run.waiting_for["prompt"][:15], approved))
        drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert decisions == [("Contract C-0009", True), ("Contract C-0011", False)]
    assert run.output["reviewed"] == 12 and run.output["escalated"] == 2 and run.output["rejected"] == ["C-0011"]
    assert run.progress == {"done": 12, "total": 12, "label": "contracts"}

    accepted = [e.payload["result"] for e in SessionEvent.objects.steps().filter(
        run_id=run_id, step_name="examples.contracts.accept_review").order_by("position")]
    assert [r["contract_id"] for r in accepted] == [f"C-{i:04d}" for i in range(1, 13)]
    assert {r["rounds"] for r in accepted} == {1, 2}  # the critic sent some drafts back
    assert accepted[8]["signed_off_by"] == ["olga"]
    checkpoints = Checkpoint.objects.filter(run_id=run_id, decision="taken").order_by("position")
    assert checkpoints.count() == 12
    assert checkpoints.last().state["reviewed"] == 12 and checkpoints.last().state["rejected"] == ["C-0011"]
    assert [line["action"] for line in outbox_lines(tmp_path)] == ["contract_report"]
    assert SideEffect.objects.filter(run_id=run_id, status="completed").count() == 1


def test_an_unreadable_contract_fails_the_run_at_that_contract(monkeypatch, tmp_path, drive):
    from journal.models import Run

    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path))
    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)
    run_id = journal.start("contract_review", size=6, corrupt=[4], high_risk=11)
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "failed" and "C-0004 is an unreadable scan" in run.error
    assert run.progress["done"] == 3
    assert outbox_lines(tmp_path) == []


@pytest.mark.parametrize("size", [40, pytest.param(500, marks=pytest.mark.slow)])
def test_killed_twice_at_random_contracts_it_resumes_there_and_reviews_nothing_twice(
        worker_env, spawn_worker, tmp_path, size):
    """Real `runworker` processes, SIGKILLed while they wait for a model answer at a random contract
    (the 500-contract portfolio of the issue runs with DURABLE_SLOW=1)."""
    from journal.models import Run, SessionEvent

    rng = random.Random()
    kill_at = sorted(rng.sample(range(3, size - 2), 2))
    workers: list = []
    kills: list[tuple[str, int]] = []  # (contract, index in server.received when killed)
    lock = threading.Lock()

    def before_answer(body: dict) -> bool | None:
        if system_tag(body["messages"]) != "contract-draft":
            return None
        contract = contract_of(body)
        with lock:
            if len(kills) < len(kill_at) and contract == f"C-{kill_at[len(kills)]:04d}":
                kills.append((contract, len(server.received)))
                workers[-1].kill()
                return False
        return None

    server = LocalModelServer(demo_responder, before_answer=before_answer).start()
    env = worker_env("examples.contracts", DURABLE_LLM_BASE_URL=server.base_url,
                     DURABLE_EXAMPLES_OUTBOX=str(tmp_path / "outbox"))
    try:
        run_id = journal.start("contract_review", size=size, high_risk=11)
        for n in range(len(kill_at) + 1):
            workers.append(spawn_worker(env))
            if n < len(kill_at):
                wait_for(lambda n=n: len(kills) > n, timeout=120, message=f"kill {n + 1} at {kill_at[n]}")
        run = wait_for(lambda: (r := Run.objects.get(id=run_id)).status in ("completed", "failed") and r,
                       timeout=180 + size, message="the run to finish")
    finally:
        server.stop()
    assert run.status == "completed", (run.error, workers[-1].log()[-3000:])
    assert run.attempts >= 3 and run.output["reviewed"] == size

    # Each resume continued at the contract it was killed in: the next request was that contract's draft.
    for contract, index in kills:
        assert contract_of(server.received[index]) == contract
        assert system_tag(server.received[index]["messages"]) == "contract-draft"
    # No contract was reviewed twice: no request the model answered was ever sent again ...
    answered = [json.dumps(b, sort_keys=True) for b in server.answered]
    assert len(answered) == len(set(answered))
    drafted = {contract_of(b) for b in server.answered if system_tag(b["messages"]) == "contract-draft"}
    assert drafted == {f"C-{i:04d}" for i in range(1, size + 1)}
    # ... each contract's critic-approved review is in the journal once ...
    accepted = [e.payload["result"]["contract_id"] for e in SessionEvent.objects.steps().filter(
        run_id=run_id, step_name="examples.contracts.accept_review")]
    assert sorted(accepted) == [f"C-{i:04d}" for i in range(1, size + 1)]
    # ... and the report was written exactly once.
    assert [line["action"] for line in outbox_lines(tmp_path / "outbox")] == ["contract_report"]
    assert run.progress == {"done": size, "total": size, "label": "contracts"}
