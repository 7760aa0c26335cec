"""Graphs run as durable-ui runs, instrumented to count node executions in a file.

Each node appends a line to $DURABLE_TEST_DIR/executions.log *before* its work, so a node killed
mid-way still counts. LG_KILL_AT=n4 SIGKILLs the worker inside node n4, once (a marker file).
"""

import operator
import os
import signal
import time
from pathlib import Path
from typing import Annotated, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from journal.contrib.langgraph import graph_workflow
from journal.models import LangGraphWrite


def _dir() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp"))


def executions(directory: Path | None = None) -> list[str]:
    path = (directory or _dir()) / "executions.log"
    return path.read_text().splitlines() if path.exists() else []


def _log(line: str) -> None:
    with open(_dir() / "executions.log", "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _maybe_die(node: str) -> None:
    if os.environ.get("LG_KILL_AT") != node:
        return
    marker = _dir() / f"killed-at-{node}"
    if not marker.exists():
        marker.write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)


class State(TypedDict):
    done: Annotated[list[str], operator.add]


def _node(name: str):
    def run(state: State) -> dict:
        _log(name)
        _maybe_die(name)
        time.sleep(float(os.environ.get("LG_NODE_SLEEP", "0.01")))
        return {"done": [name]}

    return run


@graph_workflow(name="lg-six")
def six_nodes() -> StateGraph:
    """Six nodes in a line, one super-step each."""
    builder = StateGraph(State)
    names = [f"n{i}" for i in range(1, 7)]
    for name in names:
        builder.add_node(name, _node(name))
    for a, b in zip([START, *names], [*names, END], strict=True):
        builder.add_edge(a, b)
    return builder


class Refund(TypedDict, total=False):
    order: str
    draft: str
    verdicts: Annotated[list[str], operator.add]
    sent: str


def _draft(state: Refund) -> dict:
    _log("draft")
    return {"draft": f"refund order {state['order']}"}


def _review(role: str):
    def review(state: Refund) -> dict:
        decision = interrupt({"question": f"{role}: send '{state['draft']}'?", "draft": state["draft"]})
        _log(f"reviewed by {role}")  # after interrupt(): runs once, when the graph resumes with the decision
        if not decision["approved"]:
            return {"verdicts": [f"{role} rejected"]}
        return {"draft": decision.get("edited") or state["draft"],
                "verdicts": [f"{role} approved ({', '.join(decision['decided_by'])})"]}

    return review


def _send(state: Refund) -> dict:
    _log("send")
    rejected = any("rejected" in v for v in state.get("verdicts", []))
    return {"sent": "" if rejected else state["draft"]}


@graph_workflow(name="lg-refund")
def refund_with_two_reviews() -> StateGraph:
    """Draft a refund, a manager and then finance review it (graph interrupts), then send."""
    builder = StateGraph(Refund)
    builder.add_node("draft", _draft)
    builder.add_node("manager", _review("manager"))
    builder.add_node("finance", _review("finance"))
    builder.add_node("send", _send)
    for a, b in [(START, "draft"), ("draft", "manager"), ("manager", "finance"), ("finance", "send"), ("send", END)]:
        builder.add_edge(a, b)
    return builder


class Pair(TypedDict, total=False):
    fast: str
    slow: str
    joined: str


def _fast(state: Pair) -> dict:
    _log("fast")
    return {"fast": "fast done"}


def _slow(state: Pair, config: RunnableConfig) -> dict:
    """LG_KILL_AT=slow: dies once its sibling's write is saved (a half-finished super-step)."""
    _log("slow")
    if os.environ.get("LG_KILL_AT") == "slow":
        thread_id = config["configurable"]["thread_id"]
        deadline = time.monotonic() + 20
        while not LangGraphWrite.objects.filter(thread_id=thread_id, channel="fast").exists():
            if time.monotonic() > deadline:
                raise AssertionError("the fast task's write was never saved")
            time.sleep(0.02)
        _maybe_die("slow")
    return {"slow": "slow done"}


def _join(state: Pair) -> dict:
    _log("join")
    return {"joined": f"{state['fast']} + {state['slow']}"}


@graph_workflow(name="lg-pair")
def fast_and_slow() -> StateGraph:
    """Two nodes in one super-step, then a join."""
    builder = StateGraph(Pair)
    builder.add_node("fast", _fast)
    builder.add_node("slow", _slow)
    builder.add_node("join", _join)
    builder.add_edge(START, "fast")
    builder.add_edge(START, "slow")
    builder.add_edge(["fast", "slow"], "join")
    builder.add_edge("join", END)
    return builder
