"""The research example end to end: tools, model calls over HTTP, publishing once, and a counterfactual fork."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import journal
from examples.llm import demo_responder
from examples.local_llm_server import LocalModelServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model_server(monkeypatch, tmp_path):
    srv = LocalModelServer(demo_responder).start()
    monkeypatch.setenv("DURABLE_LLM_BASE_URL", srv.base_url)
    monkeypatch.setenv("DURABLE_LLM_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path / "outbox"))
    yield srv
    srv.stop()


def outbox_lines(tmp_path) -> list[dict]:
    log = tmp_path / "outbox" / "outbox.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_research_searches_reads_synthesizes_and_publishes_once(model_server, drive, tmp_path):
    from journal.models import EventKind, Run, SessionEvent, SideEffect

    run_id = journal.start("research", "durable execution for AI agents")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert run.output["sources"] == ["S1", "S3"] and run.output["cited"] == ["S1", "S3"]
    report = json.loads(Path(run.output["published"]).read_text())
    assert report["status"] == "published" and report["title"] == "Durable Execution For Ai Agents"
    assert [line["action"] for line in outbox_lines(tmp_path)] == ["publish"]

    steps = list(SessionEvent.objects.steps().filter(run_id=run_id).order_by("position"))
    names = [s.step_name for s in steps]
    assert names == ["model:gpt-4o-mini", "tool:search_sources", "model:gpt-4o-mini", "tool:read_source",
                     "model:gpt-4o-mini", "tool:read_source", "model:gpt-4o-mini", "model:gpt-4o-mini",
                     "model:gpt-4o-mini", "examples.research.publish_report", "examples.research.fact_check"]
    prompt_versions = [s.payload["prompt_version"] for s in steps if s.payload.get("kind") == "model"]
    assert prompt_versions == ["research-gather-v1"] * 4 + ["research-analyze-v1", "research-synthesize-v1"]
    tool_calls = list(SessionEvent.objects.filter(run_id=run_id, kind=EventKind.TOOL_CALL).order_by("seq"))
    assert [(t.payload["tool"], t.position, t.payload["ok"]) for t in tool_calls] == [
        ("search_sources", 2, True), ("read_source", 4, True), ("read_source", 6, True)]
    assert tool_calls[1].payload["arguments"] == {"source_id": "S1"}
    assert len(model_server.answered) == 6
    assert run.tokens == sum(s.payload["tokens_in"] + s.payload["tokens_out"] for s in steps
                             if s.payload.get("kind") == "model")
    assert SideEffect.objects.get(run_id=run_id).status == "completed"
    assert run.progress == {"done": 4, "total": 4, "label": "stages"}


def test_research_fork_with_another_model_replays_the_history_and_calls_only_the_rest(model_server, drive):
    from journal.models import Run
    from journal.operations.whatif import compare_runs, fork_with_model

    run_id = journal.start("research", "sagas and compensation")
    drive()
    assert Run.objects.get(id=run_id).status == "completed"
    before = len(model_server.answered)
    assert before == 6

    with pytest.raises(journal.BadArgumentsError, match="not a model call"):
        fork_with_model(run_id, 2, model="scripted-large")
    with pytest.raises(journal.BadArgumentsError, match="model= or params="):
        fork_with_model(run_id, 9)
    fork_id = fork_with_model(run_id, 9, model="scripted-large", actor="alice")
    drive()
    fork = Run.objects.get(id=fork_id)
    assert fork.status == "completed", fork.error
    assert fork.forked_from_id is not None and fork.fork_step == 9
    # steps 1-8 came from the parent's journal: only the synthesis was sent again, to the other model
    assert [b["model"] for b in model_server.answered[before:]] == ["scripted-large"]

    cmp = compare_runs(run_id, fork_id)
    assert cmp["first_difference"] == 9
    assert [row["same"] for row in cmp["steps"][:8]] == [True] * 8
    step9 = cmp["steps"][8]
    assert step9["a"]["model"] == "gpt-4o-mini" and step9["b"]["model"] == "scripted-large"
    assert "larger model" in step9["b"]["content"] and "larger model" not in step9["a"]["content"]
    assert cmp["a"]["models"] == ["gpt-4o-mini"] and cmp["b"]["models"] == ["gpt-4o-mini", "scripted-large"]
    assert cmp["b"]["override"]["model"] == "scripted-large" and cmp["same_output"] is False
    assert cmp["b"]["cost"] > 0
    only_models = compare_runs(run_id, fork_id, models_only=True)["steps"]
    assert all((r["a"] or r["b"])["kind"] == "model" for r in only_models)


def test_a_fork_with_other_parameters_keeps_the_model_and_changes_the_parameters(model_server, drive):
    from journal.models import Run
    from journal.operations.whatif import compare_runs, fork_with_model

    run_id = journal.start("research", "agents that wait for humans")
    drive()
    fork_id = fork_with_model(run_id, 8, params={"temperature": 0.9}, actor="bob")
    drive()
    assert Run.objects.get(id=fork_id).status == "completed"
    resent = model_server.answered[6:]
    assert [(b["model"], b["temperature"]) for b in resent] == [("gpt-4o-mini", 0.9), ("gpt-4o-mini", 0.9)]
    cmp = compare_runs(run_id, fork_id)
    assert cmp["b"]["override"]["params"] == {"temperature": 0.9} and cmp["first_difference"] == 8


def test_a_failed_fact_check_after_publishing_is_compensated_by_retracting(model_server, drive, tmp_path):
    from journal.models import Run

    run_id = journal.start("research", "durable execution for AI agents", fact_check_mode="strict")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "compensated", (run.status, run.error)
    assert "fact check (strict) failed" in run.error
    assert [line["action"] for line in outbox_lines(tmp_path)] == ["publish", "retract"]
    published = sorted((tmp_path / "outbox").glob("report-*.json"))
    assert len(published) == 1 and json.loads(published[0].read_text())["status"] == "retracted"
