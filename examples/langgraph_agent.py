"""A LangGraph tool-calling agent, moved onto durable-ui by one line.

The graph is ordinary LangGraph: a model node, a ToolNode, `tools_condition`. The model here is
a fake (offline, deterministic), standing in for `ChatOpenAI(...).bind_tools(TOOLS)`. The one
line that changes is the checkpointer::

    graph = build().compile(checkpointer=InMemorySaver())    # before: gone with the process
    graph = build().compile(checkpointer=JournalSaver())     # after: durable-ui's database

and, to have durable-ui's workers drive it (a dead worker's thread resumes on another, the run
shows in the dashboard), the builder is registered with `@graph_workflow` and started with
`start("langgraph-support", {...})`; name this module in DURABLE_AGENT_MODULES.

    .venv/bin/python examples/langgraph_agent.py "Where is order A-7?"
"""

from __future__ import annotations

import os
import sys

import django
from django.apps import apps

if not apps.models_ready:  # run as a script: set Django up before durable-ui's models are imported
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
    django.setup()

import re  # noqa: E402

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from journal.contrib.langgraph import JournalSaver, graph_workflow  # noqa: E402

ORDERS = {"A-7": "shipped on Monday, arriving Thursday", "B-2": "waiting for stock"}


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order's status."""
    return ORDERS.get(order_id, "no such order")


TOOLS = [lookup_order]


def fake_model(state: MessagesState) -> dict:
    """Asks for the order tool when the customer names an order, then answers from its result."""
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(content=f"Your order is {last.content}.")]}
    match = re.search(r"\b[A-Z]-\d+\b", str(last.content))
    if match:
        call = {"name": "lookup_order", "args": {"order_id": match.group()}, "id": f"call-{match.group()}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content="Which order? Tell me its number, like A-7.")]}


@graph_workflow(name="langgraph-support")
def build() -> StateGraph:
    """A support agent that looks orders up (LangGraph: model -> tools -> model)."""
    builder = StateGraph(MessagesState)
    builder.add_node("model", fake_model)
    builder.add_node("tools", ToolNode(TOOLS))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder


def ask(question: str, thread_id: str = "support-1") -> str:
    graph = build().compile(checkpointer=JournalSaver())  # the one line: was InMemorySaver()
    result = graph.invoke({"messages": [HumanMessage(content=question)]}, {"configurable": {"thread_id": thread_id}})
    return result["messages"][-1].content


if __name__ == "__main__":
    from django.core.management import call_command  # a script's own database needs its tables

    call_command("migrate", verbosity=0)
    print(ask(" ".join(sys.argv[1:]) or "Where is order A-7?"))
