"""journal.contrib.pydantic_ai: a Pydantic AI agent's model requests and tool calls as journaled steps."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import journal
from journal.contrib.pydantic_ai import DurableAgent, idempotency_key
from tests.agents import pydantic_ai_agents as pa

AGENTS = "tests.agents.pydantic_ai_agents"


def counts() -> Counter:
    return Counter(line if not line.startswith("effect") else "effect" for line in pa.executions())


def uninterrupted_output(run_id: str) -> str:
    return (f"Done: Oslo: 3 degrees, snow; {{'booked': 'Oslo', 'confirmation': '{run_id}:4', 'nights': 2}}")


@pytest.mark.django_db(transaction=True)
def test_each_model_request_and_tool_call_is_a_step_with_tokens_and_cost(drive):
    from journal.models import EffectStatus, Run, SessionEvent, SideEffect, TraceSpan

    run_id = journal.start("pai_travel", "trip to Oslo?")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert run.output == {"output": uninterrupted_output(run_id), "requests": 3}
    records = list(SessionEvent.objects.steps().filter(run_id=run_id).order_by("position"))
    names = [r.step_name for r in records]
    assert names[1:5:2] == ["tool:weather", "tool:book_hotel"]
    assert names[0] == names[2] == names[4] and names[0].startswith("model:function:travel_model")
    assert [r.payload["kind"] for r in records] == ["model", "tool", "model", "effect", "model"]
    models = [r.payload for r in records if r.payload["kind"] == "model"]
    assert all(p["tokens_in"] > 0 and p["tokens_out"] > 0 for p in models)
    assert run.tokens == sum(p["tokens_in"] + p["tokens_out"] for p in models)
    assert models[0]["tool_calls"] == 1 and models[2]["tool_calls"] == 0
    effect = SideEffect.objects.get(run_id=run_id)
    assert (effect.position, effect.status, effect.idempotency_key) == (4, EffectStatus.COMPLETED, f"{run_id}:4")
    kinds = sorted(TraceSpan.objects.filter(run_id=run_id, position__isnull=False).values_list("kind", flat=True))
    assert kinds == ["effect", "model", "model", "model", "tool"]


@pytest.mark.django_db(transaction=True)
def test_a_resumed_run_replays_the_agent_loop_without_calling_model_or_tools(drive):
    from journal.models import EventKind, Run, SessionEvent

    run_id = journal.start("pai_travel_then_wait", "trip to Oslo?")
    drive()
    assert Run.objects.get(id=run_id).status == "suspended"
    before = counts()
    assert before == Counter({"model 1": 1, "tool weather Oslo": 1, "model 2": 1, "effect": 1, "model 3": 1})
    journal.signal(run_id, "go", "thanks")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert counts() == before  # the whole loop came back from the journal: 3 model calls and 2 tools avoided
    assert run.output == {"output": uninterrupted_output(run_id), "extra": "thanks", "messages": 6}
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.NONDETERMINISM).exists()


@pytest.mark.django_db(transaction=True)
def test_await_run_inside_async_code_of_a_workflow_is_journaled_too(drive):
    from journal.models import Run, SessionEvent

    run_id = journal.start("pai_travel_async", "trip to Oslo?")
    drive()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.output) == ("completed", uninterrupted_output(run_id)), run.error
    assert SessionEvent.objects.steps().filter(run_id=run_id).count() == 5


@pytest.mark.django_db(transaction=True)
def test_the_event_stream_handler_sees_live_events_and_replay_does_not_call_the_model(drive):
    from journal.models import Run

    pa.STREAMED.clear()
    run_id = journal.start("pai_travel_streamed", "trip to Oslo?")
    drive()
    assert "PartStartEvent" in pa.STREAMED and "FunctionToolCallEvent" in pa.STREAMED
    assert "FunctionToolResultEvent" in pa.STREAMED
    first = counts()
    journal.signal(run_id, "go")
    drive()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.output) == ("completed", uninterrupted_output(run_id)), run.error
    assert counts() == first


def test_outside_a_workflow_the_agent_runs_as_it_is_and_an_effect_tool_has_no_key():
    assert prompt_agent.run_sync("hello").output == "ok"
    with pytest.raises(journal.DurableError, match="effect"):
        pa.durable_travel.run_sync("trip?")  # book_hotel asks for a key no ledger gave it
    assert counts() == Counter({"model 1": 1, "tool weather Oslo": 1, "model 2": 1})
    with pytest.raises(journal.DurableError, match="effects="):
        idempotency_key()


def test_an_unknown_in_doubt_policy_fails_at_construction():
    with pytest.raises(journal.WorkflowDefinitionError, match="in-doubt policy"):
        DurableAgent(Agent(TestModel()), effects={"pay": "guess"})


PROMPT = {"text": "first wording"}
prompt_agent = DurableAgent(Agent(TestModel(custom_output_text="ok"), name="prompted"))


@journal.workflow(name="pai_prompt_changes")
def prompt_changes(ctx) -> str:
    out = prompt_agent.run_sync(PROMPT["text"]).output
    ctx.wait_for_signal("go")
    return out


@pytest.mark.django_db(transaction=True)
def test_a_changed_prompt_on_replay_is_nondeterminism_not_a_new_request(drive, monkeypatch):
    from journal.models import EventKind, Run, SessionEvent

    run_id = journal.start("pai_prompt_changes")
    drive()
    assert Run.objects.get(id=run_id).status == "suspended"
    monkeypatch.setitem(PROMPT, "text", "second wording")
    journal.signal(run_id, "go")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "needs_attention"
    event = SessionEvent.objects.get(run_id=run_id, kind=EventKind.NONDETERMINISM)
    assert event.payload["position"] == 1 and "model:test" in event.payload["expected"]


# -- a real worker process, SIGKILLed mid-loop ------------------------------------------------------

def _finish(env, spawn_worker, run_id):
    worker = spawn_worker(env)
    run = journal.wait(run_id, timeout=90)
    assert worker.terminate() == 0, worker.log()
    return run


@pytest.mark.django_db(transaction=True)
def test_killed_during_the_second_model_request_resumes_without_repeating_the_first(worker_env, spawn_worker):
    from journal.models import EffectStatus, SideEffect

    run_id = journal.start("pai_travel", "trip to Oslo?")
    first = spawn_worker(worker_env(AGENTS, PAI_KILL_AT_REQUEST="2"))
    assert first.wait(timeout=60) == -9  # really SIGKILLed, inside the second model request
    assert counts() == Counter({"model 1": 1, "tool weather Oslo": 1, "model 2": 1})
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == "completed", run.error
    assert run.output == {"output": uninterrupted_output(run_id), "requests": 3}
    # the first request and the first tool were replayed; only the request in flight ran again
    assert counts() == Counter({"model 1": 1, "tool weather Oslo": 1, "model 2": 2, "effect": 1, "model 3": 1})
    assert SideEffect.objects.get(run_id=run_id).status == EffectStatus.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_killed_after_the_effect_tool_ran_before_its_record_needs_attention(worker_env, spawn_worker):
    from journal.models import EffectStatus, SideEffect

    run_id = journal.start("pai_travel", "trip to Oslo?")
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="effect_executed:position=4"))
    assert first.wait(timeout=60) == -9
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == "needs_attention"
    assert "outcome was never recorded" in run.attention_reason
    assert SideEffect.objects.get(run_id=run_id).status == EffectStatus.STARTED
    assert counts()["effect"] == 1  # never re-run on a guess
    assert counts()["model 1"] == 1 and counts()["tool weather Oslo"] == 1


@pytest.mark.django_db(transaction=True)
def test_killed_after_a_committed_step_repeats_nothing(worker_env, spawn_worker):
    run_id = journal.start("pai_travel", "trip to Oslo?")
    fault = "after_commit:position=4;kind=step_completed"  # right after the effect's record committed
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS=fault))
    assert first.wait(timeout=60) == -9
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == "completed", run.error
    assert run.output["output"] == uninterrupted_output(run_id)
    assert set(counts().values()) == {1}, counts()
