"""Model calls: the HTTP client against a real local server, and ctx.model as a durable step."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

import journal
from examples.local_llm_server import LocalModelServer
from journal.primitives.llm_clients import ModelError, OpenAIClient, ScriptedClient, cost_of


def weather_responder(messages, tools, params):
    if tools and not any(m.get("role") == "tool" for m in messages):
        return {"tool_calls": [{"id": "call_w", "name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]}
    return f"It is {len(messages)} messages in; answer for {params['model']} at t={params.get('temperature', 1)}."


@pytest.fixture
def server():
    srv = LocalModelServer(weather_responder).start()
    yield srv
    srv.stop()


def test_client_plain_json_returns_content_and_usage(server):
    client = OpenAIClient(server.base_url, api_key="k", model="gpt-4o-mini")
    reply = client.complete([{"role": "user", "content": "hi"}], model="gpt-4o-mini", temperature=0)
    assert reply["content"] == "It is 1 messages in; answer for gpt-4o-mini at t=0."
    assert reply["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] > 0 and reply["usage"]["completion_tokens"] > 0
    assert server.answered[0]["temperature"] == 0


def test_client_streaming_is_aggregated_into_one_result(server):
    client = OpenAIClient(server.base_url, model="m", stream=True)
    plain = OpenAIClient(server.base_url, model="m").complete([{"role": "user", "content": "x" * 50}], model="m")
    streamed = client.complete([{"role": "user", "content": "x" * 50}], model="m")
    assert streamed == plain
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    called = client.complete([{"role": "user", "content": "weather?"}], model="m", tools=tools)
    assert called["finish_reason"] == "tool_calls"
    assert called["tool_calls"] == [{"id": "call_w", "name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]
    assert called["usage"]["completion_tokens"] > 0
    assert [b.get("stream") for b in server.answered] == [None, True, True]


def test_client_retries_429_honouring_retry_after_then_succeeds(server):
    # The retries are the openai SDK's own now: a 429 with Retry-After waits that long, a 503 backs off.
    client = OpenAIClient(server.base_url, model="m")
    server.fail_next(429, retry_after=1.5)
    server.fail_next(503)
    t0 = time.monotonic()
    reply = client.complete([{"role": "user", "content": "hi"}], model="m")
    assert reply["content"].startswith("It is 1")
    assert len(server.received) == 3 and len(server.answered) == 1
    assert time.monotonic() - t0 >= 1.5


def test_client_does_not_retry_a_client_error_and_says_why(server):
    client = OpenAIClient(server.base_url, model="m")
    server.fail_next(401)
    with pytest.raises(ModelError, match="401"):
        client.complete([{"role": "user", "content": "hi"}], model="m")
    assert len(server.received) == 1
    with pytest.raises(ModelError, match="http"):
        OpenAIClient("ftp://example.com")


def test_client_gives_up_after_its_retries(server):
    client = OpenAIClient(server.base_url, model="m", max_retries=2)
    server.fail_next(500, times=5)
    with pytest.raises(ModelError, match="500"):
        client.complete([{"role": "user", "content": "hi"}], model="m")
    assert len(server.received) == 3


def test_cost_comes_from_genai_prices_unless_overridden(monkeypatch, settings):
    assert cost_of("claude-sonnet-4-6", 1_000_000, 1_000_000) == pytest.approx(18.0)  # genai-prices' table
    assert cost_of("scripted-large", 1_000_000, 0) == pytest.approx(2.5)  # the demo models keep a price
    settings.DURABLE_MODEL_PRICES = {"claude-sonnet-4-6": (1, 1)}
    assert cost_of("claude-sonnet-4-6", 1_000_000, 1_000_000) == pytest.approx(2.0)


def test_cost_uses_the_price_table_and_the_longest_prefix(monkeypatch):
    assert cost_of("gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.75)
    assert cost_of("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(0.15)
    assert cost_of("unknown-model", 10, 10) == 0
    monkeypatch.setenv("DURABLE_LLM_PRICES", '{"unknown-model": [1, 2]}')
    assert cost_of("unknown-model", 1_000_000, 1_000_000) == pytest.approx(3.0)
    monkeypatch.setenv("DURABLE_LLM_PRICES", "not json")
    with pytest.raises(ModelError, match="DURABLE_LLM_PRICES"):
        cost_of("x", 1, 1)


def test_scripted_client_is_deterministic_and_counts_calls():
    client = ScriptedClient(weather_responder, model="scripted-small")
    a = client.complete([{"role": "user", "content": "hi"}], model="scripted-small")
    b = client.complete([{"role": "user", "content": "hi"}], model="scripted-small")
    assert a == b and client.calls == 2


# -- ctx.model as a durable step -------------------------------------------------------------

@journal.workflow(name="test_llm_ask_twice")
def ask_twice(ctx, question: str) -> dict:
    client = OpenAIClient.from_env()
    first = ctx.model(client, [{"role": "user", "content": question}], prompt_version="ask-v1", temperature=0)
    go_on = ctx.wait_for_signal("continue")
    second = ctx.model(client, [{"role": "user", "content": question}, {"role": "assistant",
                       "content": first["content"]}, {"role": "user", "content": go_on}], model="gpt-4o",
                       prompt_version="ask-v1")
    return {"first": first["content"], "second": second["content"]}


@pytest.mark.django_db(transaction=True)
def test_model_call_is_recorded_with_tokens_and_cost_and_never_resent_on_replay(server, monkeypatch, drive):
    from journal.models import EventKind, Run, RunStatus, SessionEvent, TraceSpan

    monkeypatch.setenv("DURABLE_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("DURABLE_LLM_MODEL", "gpt-4o-mini")
    run_id = journal.start("test_llm_ask_twice", "what is durable execution?")
    drive()
    assert Run.objects.get(id=run_id).status == RunStatus.SUSPENDED
    assert len(server.answered) == 1
    server.fail_next(429, retry_after=0)  # the live second call retries once
    journal.signal(run_id, "continue", "and why?")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    # the first call replayed from the journal on resume: the server saw it once
    assert len(server.answered) == 2
    assert [b["model"] for b in server.answered] == ["gpt-4o-mini", "gpt-4o"]

    records = list(SessionEvent.objects.steps().filter(run_id=run_id, step_name__startswith="model:").order_by("seq"))
    assert [r.step_name for r in records] == ["model:gpt-4o-mini", "model:gpt-4o"]
    first = records[0].payload
    assert first["kind"] == "model" and first["model"] == "gpt-4o-mini" and first["prompt_version"] == "ask-v1"
    assert first["tokens_in"] > 0 and first["tokens_out"] > 0 and first["latency_ms"] > 0
    assert first["cost"] == cost_of("gpt-4o-mini", first["tokens_in"], first["tokens_out"])
    assert first["args"]["messages"] == [{"role": "user", "content": "what is durable execution?"}]
    assert first["args"]["params"] == {"temperature": 0}
    assert first["result"]["content"] == run.output["first"]

    spans = list(TraceSpan.objects.filter(run_id=run_id, kind="model").order_by("position"))
    assert [(s.model, s.tokens_in, s.tokens_out) for s in spans] == [
        (r.payload["model"], r.payload["tokens_in"], r.payload["tokens_out"]) for r in records]
    total_tokens = sum(r.payload["tokens_in"] + r.payload["tokens_out"] for r in records)
    assert run.tokens == total_tokens
    assert run.cost == pytest.approx(Decimal(str(sum(r.payload["cost"] for r in records))), abs=Decimal("0.000002"))
    assert sum(s.cost for s in spans) == pytest.approx(run.cost, abs=Decimal("0.000002"))
    assert not SessionEvent.objects.filter(run_id=run_id, kind=EventKind.NONDETERMINISM).exists()


@journal.workflow(name="test_llm_failing_model")
def failing_model(ctx) -> str:
    client = OpenAIClient.from_env(max_retries=1)
    return ctx.model(client, [{"role": "user", "content": "hi"}])["content"]


@pytest.mark.django_db(transaction=True)
def test_a_model_error_fails_the_run_with_the_reason_recorded_at_its_step(server, monkeypatch, drive):
    from journal.models import Run, RunStatus, SessionEvent

    monkeypatch.setenv("DURABLE_LLM_BASE_URL", server.base_url)
    server.fail_next(500, times=2)
    run_id = journal.start("test_llm_failing_model")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == RunStatus.FAILED and "500" in run.error
    record = SessionEvent.objects.steps().get(run_id=run_id, position=1)
    assert record.payload["error"]["type"] == "ModelError" and record.payload["kind"] == "model"
    assert run.tokens == 0


def flaky_responder(messages, tools, params):
    flaky_responder.calls += 1
    if flaky_responder.calls == 1:
        raise ConnectionError("the model server hung up")
    return "fine the second time"


flaky_responder.calls = 0


@journal.workflow(name="test_llm_retried_model")
def retried_model(ctx) -> str:
    client = ScriptedClient(flaky_responder, model="scripted-small")
    return ctx.model(client, [{"role": "user", "content": "hi"}], retries=1, retry_delay=0.01)["content"]


@pytest.mark.django_db(transaction=True)
def test_a_model_call_retries_like_a_step_and_records_one_result(drive):
    from journal.models import EventKind, Run, RunStatus, SessionEvent, TraceSpan

    flaky_responder.calls = 0
    run_id = journal.start("test_llm_retried_model")
    drive()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "fine the second time")
    record = SessionEvent.objects.steps().get(run_id=run_id, position=1)
    assert (record.payload["attempt"], record.payload["kind"]) == (2, "model")
    failed = SessionEvent.objects.get(run_id=run_id, kind=EventKind.STEP_FAILED)
    assert failed.payload["error"]["type"] == "ConnectionError" and failed.payload["will_retry"]
    assert sorted(TraceSpan.objects.filter(run_id=run_id).values_list("status", flat=True)) == ["error", "ok"]
    assert flaky_responder.calls == 2


@journal.workflow(name="test_llm_long_chat")
def long_chat(ctx, turns: int) -> int:
    client = ScriptedClient(model="scripted-small")
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"message {i} " + "x" * 1000})
        messages.append({"role": "assistant", "content": ctx.model(client, messages)["content"]})
    return len(messages)


@pytest.mark.django_db(transaction=True)
def test_a_long_conversation_is_stored_message_by_message(drive):
    from journal.models import Blob, Run, SessionEvent
    from journal.primitives.llm import load_request

    run_id = journal.start("test_llm_long_chat", 40)
    drive()
    assert Run.objects.get(id=run_id).status == "completed"
    last = SessionEvent.objects.steps().filter(run_id=run_id).order_by("-position").first()
    assert "request_ref" in last.payload
    request = load_request(last.payload)
    assert len(request["messages"]) == 80 and request["messages"][0]["content"] == "You are terse."
    stored = sum(b.size for b in Blob.objects.all())
    raw_last_request = sum(len(m["content"]) for m in request["messages"])
    # each message stored once, not once per call: O(n), not O(n^2)
    assert stored < 3 * raw_last_request


PROMPT = {"text": "first wording"}  # deliberately read from a global: the test changes it between runs


@journal.workflow(name="test_llm_prompt_changes")
def prompt_changes(ctx) -> str:
    client = ScriptedClient(model="scripted-small")
    answer = ctx.model(client, [{"role": "user", "content": PROMPT["text"]}])
    ctx.wait_for_signal("go")
    return answer["content"]


@pytest.mark.django_db(transaction=True)
def test_a_changed_prompt_on_replay_is_reported_as_nondeterminism_not_resent(drive, monkeypatch):
    from journal.models import EventKind, Run, SessionEvent

    run_id = journal.start("test_llm_prompt_changes")
    drive()
    assert Run.objects.get(id=run_id).status == "suspended"
    monkeypatch.setitem(PROMPT, "text", "second wording")
    journal.signal(run_id, "go")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "needs_attention"
    event = SessionEvent.objects.get(run_id=run_id, kind=EventKind.NONDETERMINISM)
    assert event.payload["position"] == 1 and "model:scripted-small" in event.payload["expected"]
    assert "different arguments" in run.attention_reason
