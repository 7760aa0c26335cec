"""ctx.model with the official openai and anthropic SDK clients, as users build them."""

from __future__ import annotations

import json
import os

import anthropic
import httpx2
import openai
import pytest

import journal
from examples.local_llm_server import LocalModelServer
from journal.primitives.llm_clients import ModelError, cost_of

pytestmark = pytest.mark.django_db(transaction=True)


def responder(messages, tools, params):
    if tools and not any(m.get("role") == "tool" for m in messages):
        return {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": {"q": "durable"}}]}
    return f"answer to {messages[-1]['content']}"


@pytest.fixture
def server(monkeypatch):
    srv = LocalModelServer(responder).start()
    monkeypatch.setenv("TEST_OPENAI_BASE", srv.base_url)
    yield srv
    srv.stop()


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def _openai(async_: bool):
    cls = openai.AsyncOpenAI if async_ else openai.OpenAI
    return cls(base_url=os.environ["TEST_OPENAI_BASE"], api_key="k", max_retries=0)


@journal.workflow(name="test_sdk_openai")
def with_openai(ctx, async_: bool) -> dict:
    client = _openai(async_)
    call = ctx.model(client, [{"role": "user", "content": "find"}], tools=TOOLS, model="gpt-4o-mini")
    answer = ctx.model(client, [{"role": "user", "content": "and?"}], model="gpt-4o-mini", stream=True)
    ctx.wait_for_signal("go")
    return {"tool_calls": call["tool_calls"], "content": answer["content"]}


@pytest.mark.parametrize("async_", [False, True])
def test_an_openai_sdk_client_is_recorded_with_tokens_and_cost_and_not_called_on_replay(server, drive, async_):
    from journal.models import Run, SessionEvent

    run_id = journal.start("test_sdk_openai", async_)
    drive()
    assert Run.objects.get(id=run_id).status == "suspended", Run.objects.get(id=run_id).error
    assert len(server.answered) == 2 and server.answered[1]["stream"] is True
    journal.signal(run_id, "go")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert len(server.answered) == 2  # replayed from the journal
    assert run.output == {"tool_calls": [{"id": "call_1", "name": "lookup", "arguments": {"q": "durable"}}],
                          "content": "answer to and?"}
    records = [e.payload for e in SessionEvent.objects.steps().filter(run_id=run_id, step_name="model:gpt-4o-mini")]
    assert len(records) == 2 and all(p["tokens_in"] > 0 and p["tokens_out"] > 0 for p in records)
    assert records[0]["finish_reason"] == "tool_calls" and records[0]["tool_calls"] == 1
    assert all(p["cost"] == cost_of("gpt-4o-mini", p["tokens_in"], p["tokens_out"]) > 0 for p in records)
    assert run.tokens == sum(p["tokens_in"] + p["tokens_out"] for p in records)


# -- anthropic, through an httpx2 MockTransport speaking the Messages API ----------------------------

ANTHROPIC_SEEN: list[dict] = []


def messages_api(request: httpx2.Request) -> httpx2.Response:
    body = json.loads(request.content)
    ANTHROPIC_SEEN.append(body)
    if body.get("tools") and not any(isinstance(m["content"], list) for m in body["messages"]):
        content = [{"type": "text", "text": "Let me look."},
                   {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "durable"}}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": f"{body.get('system', '')}: {len(body['messages'])} turns"}]
        stop = "end_turn"
    return httpx2.Response(200, json={
        "id": "msg_1", "type": "message", "role": "assistant", "model": body["model"], "content": content,
        "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 120, "output_tokens": 30}})


def _anthropic(async_: bool):
    if async_:
        return anthropic.AsyncAnthropic(api_key="k", base_url="http://anthropic.test", max_retries=0,
                                        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(messages_api)))
    return anthropic.Anthropic(api_key="k", base_url="http://anthropic.test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(messages_api)))


@journal.workflow(name="test_sdk_anthropic")
def with_anthropic(ctx, async_: bool) -> dict:
    client = _anthropic(async_)
    messages = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "find"}]
    first = ctx.model(client, messages, tools=TOOLS, model="claude-sonnet-4-6")
    messages += [{"role": "assistant", "content": first["content"], "tool_calls": [
        {"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}} for c in first["tool_calls"]]},
        {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "found it"}]
    second = ctx.model(client, messages, tools=TOOLS, model="claude-sonnet-4-6")
    ctx.wait_for_signal("go")
    return {"first": first, "second": second["content"]}


@pytest.mark.parametrize("async_", [False, True])
def test_an_anthropic_sdk_client_is_recorded_with_tokens_and_cost_and_not_called_on_replay(drive, async_):
    from journal.models import Run, SessionEvent

    ANTHROPIC_SEEN.clear()
    run_id = journal.start("test_sdk_anthropic", async_)
    drive()
    assert len(ANTHROPIC_SEEN) == 2
    assert ANTHROPIC_SEEN[0]["system"] == "Be brief" and ANTHROPIC_SEEN[0]["tools"][0]["name"] == "lookup"
    assert ANTHROPIC_SEEN[1]["messages"][-1]["content"][0] == {
        "type": "tool_result", "tool_use_id": "toolu_1", "content": "found it"}
    journal.signal(run_id, "go")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert len(ANTHROPIC_SEEN) == 2  # replay did not call the API
    assert run.output["first"]["tool_calls"] == [{"id": "toolu_1", "name": "lookup", "arguments": {"q": "durable"}}]
    assert run.output["first"]["finish_reason"] == "tool_calls" and run.output["second"] == "Be brief: 3 turns"
    records = [e.payload for e in SessionEvent.objects.steps().filter(run_id=run_id).order_by("position")
               if e.payload.get("kind") == "model"]
    assert [(p["tokens_in"], p["tokens_out"]) for p in records] == [(120, 30), (120, 30)]
    assert records[0]["cost"] == cost_of("claude-sonnet-4-6", 120, 30) > 0
    assert run.tokens == 300


@journal.workflow(name="test_sdk_no_model")
def no_model(ctx) -> str:
    return ctx.model(_anthropic(False), [{"role": "user", "content": "hi"}])["content"]


def test_an_sdk_client_without_a_model_id_says_so(drive):
    from journal.models import Run

    run_id = journal.start("test_sdk_no_model")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "failed" and "model=" in run.error


def test_an_error_from_the_sdk_becomes_a_model_error_with_its_status():
    from journal.primitives.llm_clients import AnthropicSDKClient

    error = {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
    transport = httpx2.MockTransport(lambda request: httpx2.Response(401, json=error))
    refusing = anthropic.Anthropic(api_key="k", base_url="http://anthropic.test", max_retries=0,
                                   http_client=httpx2.Client(transport=transport))
    with pytest.raises(ModelError, match="401") as info:
        AnthropicSDKClient(refusing).complete([{"role": "user", "content": "hi"}], model="claude-sonnet-4-6")
    assert info.value.status == 401
