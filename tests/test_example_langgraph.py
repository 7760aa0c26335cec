"""The LangGraph example: an ordinary tool-calling graph on JournalSaver, in-process and as a durable run."""

import pytest
from langchain_core.messages import AIMessage, ToolMessage

import journal
from examples import langgraph_agent
from journal.contrib.langgraph import JournalSaver, start
from journal.models import LangGraphCheckpoint, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _state(thread_id: str):
    return langgraph_agent.build().compile(checkpointer=JournalSaver()).get_state(
        {"configurable": {"thread_id": thread_id}})


def test_the_agent_calls_its_tool_and_answers_from_it():
    assert langgraph_agent.ask("Where is order A-7?", thread_id="t-1") == \
        "Your order is shipped on Monday, arriving Thursday."
    state = _state("t-1")
    kinds = [type(m).__name__ for m in state.values["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert state.values["messages"][1].tool_calls[0]["args"] == {"order_id": "A-7"}


def test_a_second_question_on_the_thread_sees_the_first():
    langgraph_agent.ask("Where is order A-7?", thread_id="t-2")
    assert langgraph_agent.ask("And B-2?", thread_id="t-2") == "Your order is waiting for stock."
    state = _state("t-2")
    assert len(state.values["messages"]) == 8


def test_started_as_a_run_a_worker_drives_it_on_the_runs_thread(drive):
    run_id = start("langgraph-support", {"messages": [{"role": "user", "content": "Where is order B-2?"}]})
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    messages = run.output["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[-1]["content"] == "Your order is waiting for stock."
    tup = JournalSaver().get_tuple({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    assert isinstance(tup.checkpoint["channel_values"]["messages"][2], ToolMessage)
    assert isinstance(tup.checkpoint["channel_values"]["messages"][-1], AIMessage)
    assert LangGraphCheckpoint.objects.filter(thread_id=run_id).count() >= 4
