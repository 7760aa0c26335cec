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

from langgraph.graph import END, START, StateGraph

from journal.contrib.langgraph import graph_workflow


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
