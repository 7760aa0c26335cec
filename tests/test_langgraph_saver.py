"""JournalSaver under a real graph: a conversation kept across saver instances, message types
intact, and the storage of a growing message list linear in its length (LangGraph's own layout
rewrites the whole list at every checkpoint)."""

import asyncio
import base64
import json
import random

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.db.models import Sum
from django.db.models.functions import Length
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from journal.contrib.langgraph import JournalSaver
from journal.models import Blob, LangGraphChannel, LangGraphCheckpoint, LangGraphWrite

pytestmark = pytest.mark.django_db(transaction=True)


def _echo(state: MessagesState) -> dict:
    return {"messages": [AIMessage(content=f"echo: {state['messages'][-1].content}")]}


def _echo_graph():
    builder = StateGraph(MessagesState)
    builder.add_node("model", _echo)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    return builder


def test_a_conversation_survives_a_new_saver_and_keeps_its_message_types():
    config = {"configurable": {"thread_id": "chat-1"}}
    for turn in ("hello", "how are you", "bye"):
        graph = _echo_graph().compile(checkpointer=JournalSaver())  # a fresh process would do the same
        graph.invoke({"messages": [HumanMessage(content=turn)]}, config)
    state = _echo_graph().compile(checkpointer=JournalSaver()).get_state(config)
    messages = state.values["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage] * 3
    assert [m.content for m in messages[-2:]] == ["bye", "echo: bye"]
    history = list(_echo_graph().compile(checkpointer=JournalSaver()).get_state_history(config))
    assert len(history) == 9  # three turns of input, START, model
    assert [len(h.values.get("messages", [])) for h in history][:3] == [6, 5, 4]


def test_time_travel_forks_from_a_past_checkpoint_without_touching_the_original_branch():
    graph = _echo_graph().compile(checkpointer=JournalSaver())
    config = {"configurable": {"thread_id": "chat-fork"}}
    graph.invoke({"messages": [HumanMessage(content="one")]}, config)
    graph.invoke({"messages": [HumanMessage(content="two")]}, config)
    after_first = next(h for h in graph.get_state_history(config) if len(h.values.get("messages", [])) == 2)
    graph.invoke({"messages": [HumanMessage(content="edited")]}, after_first.config)  # a new branch from there
    latest = graph.get_state(config).values["messages"]
    assert [m.content for m in latest] == ["one", "echo: one", "edited", "echo: edited"]
    original = graph.get_state(after_first.config).values["messages"]
    assert [m.content for m in original] == ["one", "echo: one"]


def test_an_async_graph_checkpoints_through_the_async_methods_off_the_event_loop():
    config = {"configurable": {"thread_id": "chat-async"}}

    async def conversation():
        graph = _echo_graph().compile(checkpointer=JournalSaver())
        await graph.ainvoke({"messages": [HumanMessage(content="hi")]}, config)
        await graph.ainvoke({"messages": [HumanMessage(content="again")]}, config)
        state = await graph.aget_state(config)
        await sync_to_async(connections.close_all, thread_sensitive=True)()  # the sync thread's connection
        return state

    state = asyncio.run(conversation())  # the ORM on the loop would raise SynchronousOnlyOperation
    assert [m.content for m in state.values["messages"]] == ["hi", "echo: hi", "again", "echo: again"]
    assert LangGraphCheckpoint.objects.filter(thread_id="chat-async").count() == 6


MESSAGES = 200
PAYLOAD = 1024  # characters of content per message


def _content(n: int) -> str:
    return base64.b64encode(random.Random(n).randbytes(PAYLOAD * 3 // 4)).decode()  # 1 KiB, barely compressible


def _talk(state: MessagesState) -> dict:
    n = len(state["messages"])
    return {"messages": [AIMessage(content=_content(n), id=f"m{n}")]}


def _growing_graph(checkpointer):
    builder = StateGraph(MessagesState)
    builder.add_node("talk", _talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", lambda s: END if len(s["messages"]) >= MESSAGES else "talk")
    return builder.compile(checkpointer=checkpointer)


def _grow(checkpointer, thread_id: str) -> list:
    graph = _growing_graph(checkpointer)
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": MESSAGES + 10}
    graph.invoke({"messages": [HumanMessage(content=_content(0), id="m0")]}, config)
    return graph.get_state(config).values["messages"]


def _journal_bytes() -> dict:
    def total(qs, **lengths):
        return sum(v or 0 for v in qs.aggregate(**{k: Sum(Length(f)) for k, f in lengths.items()}).values())

    return {
        "blobs stored": Blob.objects.aggregate(n=Sum("stored_size"))["n"] or 0,
        "blobs raw": Blob.objects.aggregate(n=Sum("size"))["n"] or 0,
        "rows": total(LangGraphCheckpoint.objects, a="checkpoint", b="metadata")
        + sum(len(json.dumps(v)) for v in LangGraphChannel.objects.values_list("value", flat=True))
        + sum(len(json.dumps(v)) for v in LangGraphWrite.objects.values_list("value", flat=True)),
    }


def test_a_growing_message_list_costs_linear_storage_not_a_snapshot_per_checkpoint(capsys):
    assert not Blob.objects.exists()
    messages = _grow(JournalSaver(), "grow")
    assert len(messages) == MESSAGES and messages[-1].content == _content(MESSAGES - 1)
    ours = _journal_bytes()
    payload = MESSAGES * PAYLOAD

    memory = InMemorySaver()  # LangGraph's own layout (its SQLite and Postgres savers store the same blobs)
    assert len(_grow(memory, "grow")) == MESSAGES
    theirs = (sum(len(b) for _, b in memory.blobs.values())
              + sum(len(c[1]) + len(m[1]) for ns in memory.storage.values() for cps in ns.values()
                    for c, m, _ in cps.values())
              + sum(len(w[2][1]) for ws in memory.writes.values() for w in ws.values()))

    stored = ours["blobs stored"] + ours["rows"]
    raw = ours["blobs raw"] + ours["rows"]
    with capsys.disabled():
        print(f"\n{MESSAGES} messages of {PAYLOAD} B ({payload:,} B of content), "
              f"{LangGraphCheckpoint.objects.count()} checkpoints: JournalSaver {stored:,} B stored "
              f"({raw:,} B before compression; {stored / payload:.2f} B per payload byte); "
              f"snapshot per checkpoint (InMemorySaver's layout) {theirs:,} B ({theirs / payload:.1f} B per byte)")
    assert raw < 3 * payload  # linear: each message once (with its fields), plus small manifests
    assert theirs > MESSAGES / 3 * payload  # quadratic: the list again at every checkpoint
