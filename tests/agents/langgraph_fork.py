"""A small graph for the LangGraph stepper and its state fork: a plain channel and a reducer channel.

Each node appends its name to $DURABLE_TEST_DIR/lg-fork.log when it really runs, so tests can tell
which nodes a fork ran again.
"""

import operator
import os
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from journal.contrib.langgraph import graph_workflow


def executions() -> list[str]:
    path = Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "lg-fork.log"
    return path.read_text().splitlines() if path.exists() else []


def _ran(name: str) -> None:
    with open(Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "lg-fork.log", "a") as fh:
        fh.write(name + "\n")


class State(TypedDict):
    total: int  # a plain channel: the last write wins
    log: Annotated[list[str], operator.add]  # a reducer channel: writes are appended


def add_one(state: State) -> dict:
    _ran("add_one")
    return {"total": state["total"] + 1, "log": [f"add_one->{state['total'] + 1}"]}


def double(state: State) -> dict:
    _ran("double")
    return {"total": state["total"] * 2, "log": [f"double->{state['total'] * 2}"]}


def finish(state: State) -> dict:
    _ran("finish")
    return {"log": [f"finish total={state['total']}"]}


@graph_workflow(name="lg-fork")
def forkable():
    """add_one, double, finish: a three-node line."""
    builder = StateGraph(State)
    builder.add_node("add_one", add_one)
    builder.add_node("double", double)
    builder.add_node("finish", finish)
    builder.add_edge(START, "add_one")
    builder.add_edge("add_one", "double")
    builder.add_edge("double", "finish")
    builder.add_edge("finish", END)
    return builder
