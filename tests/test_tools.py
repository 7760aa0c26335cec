"""Tools: declared as steps, dispatched from the model's tool calls, recorded, replayed without re-running."""

from __future__ import annotations

import json

import pytest

import journal
from journal.primitives.llm_clients import ScriptedClient
from journal.primitives.tools import agent_loop, assistant_message, schema_for, specs, tool
from journal.store.errors import WorkflowDefinitionError

EXECUTED: list[str] = []


@tool(description="Look up an order by id.")
def lookup_order(order_id: str, verbose: bool = False) -> dict:
    EXECUTED.append(f"lookup:{order_id}")
    if order_id == "missing":
        raise LookupError("no such order")
    return {"order_id": order_id, "total": 42, "verbose": verbose}


@tool(effect=True, description="Refund an order (exactly once).")
def refund(order_id: str, amount: int, *, idempotency_key: str) -> dict:
    EXECUTED.append(f"refund:{order_id}:{idempotency_key.rsplit(':', 1)[1]}")
    return {"refunded": amount, "key": idempotency_key}


def support_responder(messages, tools, params):
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    script = [
        [{"id": "c1", "name": "lookup_order", "arguments": {"order_id": "A-1"}},
         {"id": "c2", "name": "no_such_tool", "arguments": {}},
         {"id": "c3", "name": "lookup_order", "arguments": {"order": "typo"}},
         {"id": "c4", "name": "lookup_order", "arguments": {"order_id": "missing"}}],
        [{"id": "c5", "name": "refund", "arguments": {"order_id": "A-1", "amount": 42}},
         {"id": "c6", "name": "refund", "arguments": {"order_id": "A-1", "amount": 1, "idempotency_key": "mine"}}],
    ]
    if turn < len(script):
        return {"tool_calls": script[turn]}
    return "Refunded 42 for order A-1."


@journal.workflow(name="test_tools_support")
def support(ctx) -> dict:
    client = ScriptedClient(support_responder)
    reply, conversation = agent_loop(ctx, client, [{"role": "user", "content": "refund A-1"}],
                                     [lookup_order, refund])
    ctx.wait_for_signal("done")
    tool_messages = [json.loads(m["content"]) for m in conversation if m["role"] == "tool"]
    return {"reply": reply["content"], "tools": tool_messages}


def test_schema_comes_from_the_signature_and_hides_engine_keywords():
    assert schema_for(lookup_order.__wrapped__) == {
        "type": "object", "required": ["order_id"],
        "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}}}
    assert specs([refund])[0]["function"] == {
        "name": "refund", "description": "Refund an order (exactly once).",
        "parameters": {"type": "object", "required": ["order_id", "amount"],
                       "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}}}}
    with pytest.raises(WorkflowDefinitionError, match="not declared"):
        specs([len])
    with pytest.raises(WorkflowDefinitionError, match="tool name"):
        tool(name="bad name!")(lookup_order.__wrapped__)


def test_assistant_message_uses_the_wire_format():
    msg = assistant_message({"content": "", "tool_calls": [{"id": "x", "name": "t", "arguments": {"a": 1}}]})
    assert msg == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "t", "arguments": '{"a": 1}'}}]}


@pytest.mark.django_db(transaction=True)
def test_tool_calls_run_as_steps_are_recorded_and_replay_without_running_again(drive):
    from journal.models import EventKind, Run, SessionEvent, SideEffect

    EXECUTED.clear()
    run_id = journal.start("test_tools_support")
    drive()
    assert Run.objects.get(id=run_id).status == "suspended"
    assert EXECUTED == ["lookup:A-1", "lookup:missing", "refund:A-1:5"]
    journal.signal(run_id, "done")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert EXECUTED == ["lookup:A-1", "lookup:missing", "refund:A-1:5"]  # replayed, not re-run
    assert run.output["reply"] == "Refunded 42 for order A-1."
    results = run.output["tools"]
    assert results[0] == {"result": {"order_id": "A-1", "total": 42, "verbose": False}}
    assert "unknown tool 'no_such_tool'" in results[1]["error"] and "lookup_order, refund" in results[1]["error"]
    assert "bad arguments for lookup_order" in results[2]["error"]
    assert results[3] == {"error": "LookupError: no such order"}
    assert results[4]["result"]["key"] == f"{run_id}:5"
    assert "set by the engine" in results[5]["error"]

    steps = [(e.position, e.step_name) for e in SessionEvent.objects.steps().filter(run_id=run_id).order_by("seq")]
    assert steps == [(1, "model:scripted-small"), (2, "tool:lookup_order"), (3, "tool:lookup_order"),
                     (4, "model:scripted-small"), (5, "tool:refund"), (6, "model:scripted-small"),
                     (7, "signal:done")]
    calls = list(SessionEvent.objects.filter(run_id=run_id, kind=EventKind.TOOL_CALL).order_by("seq"))
    assert [(c.payload["tool"], c.payload["tool_call_id"], c.payload["ok"], c.payload["effect"]) for c in calls] == [
        ("lookup_order", "c1", True, False), ("lookup_order", "c4", False, False), ("refund", "c5", True, True)]
    assert all(dict(steps)[c.position] == f"tool:{c.payload['tool']}" for c in calls)
    assert SideEffect.objects.get(run_id=run_id).status == "completed"
