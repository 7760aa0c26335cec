"""LangGraph with its own SQL checkpointers (SqliteSaver, PostgresSaver): a StateGraph whose one
node loops, one super-step (one checkpoint) per step, invoked with ``durability="sync"`` (each
checkpoint written before the next step runs), ``"async"`` (written in the background while the
next step runs) or ``"exit"`` (written when the graph returns).

A run is a thread (a fresh ``thread_id``). SqliteSaver keeps one connection behind a lock (its
design); PostgresSaver gets a connection pool as wide as the concurrency, as its docs suggest.
"""

from __future__ import annotations

import operator
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from .databases import Store
from .workloads import CRASH_STEP_SECONDS, CRASH_STEPS, message, record_effect, threaded


class Loop(TypedDict):
    i: int
    n: int


class Conversation(TypedDict):
    messages: Annotated[list[str], operator.add]
    n: int
    base: int


def loop_graph(node, checkpointer):
    """START -> step -> (step again until i == n) -> END."""
    builder = StateGraph(Loop)
    builder.add_node("step", node)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s["i"] >= s["n"] else "step")
    return builder.compile(checkpointer=checkpointer)


def conversation_graph(checkpointer):
    def talk(s: Conversation) -> dict:
        return {"messages": [message(s["base"] + len(s["messages"]))]}

    builder = StateGraph(Conversation)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", lambda s: END if len(s["messages"]) >= s["n"] else "talk")
    return builder.compile(checkpointer=checkpointer)


def saver(store: Store, pool_size: int = 10):
    if store.kind == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        checkpointer = SqliteSaver(sqlite3.connect(store.path, check_same_thread=False))
        checkpointer.setup()
        return checkpointer, checkpointer.conn.close
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(store.conninfo, min_size=1, max_size=pool_size, open=True,
                          kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})
    checkpointer = PostgresSaver(pool)
    checkpointer.setup()
    return checkpointer, pool.close


def _increment(s: Loop) -> dict:
    return {"i": s["i"] + 1}


class LangGraph:
    name = "LangGraph"
    modes = ("sync", "async", "exit")

    def __init__(self, store: Store) -> None:
        self.checkpointer, self._close = saver(store)
        self.graph = loop_graph(_increment, self.checkpointer)
        self.talk = conversation_graph(self.checkpointer)

    def one_run(self, steps: int, mode: str = "sync") -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps + 10}
        out = self.graph.invoke({"i": 0, "n": steps}, config, durability=mode)
        assert out["i"] == steps, out

    def many_runs(self, runs: int, steps: int, concurrency: int) -> None:
        threaded(lambda _: self.one_run(steps), runs, concurrency)

    def conversation(self, messages: int, base: int = 0) -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": messages + 10}
        out = self.talk.invoke({"messages": [], "n": messages, "base": base}, config, durability="sync")
        assert len(out["messages"]) == messages

    def close(self) -> None:
        self._close()


def open_system(store: Store) -> LangGraph:
    return LangGraph(store)


def crash(store: Store, log: Path, *, resume: bool) -> None:
    """First process: invoke the 20-step thread (until killed). Second: the caller invokes the same
    thread again with no input, which resumes it from its last checkpoint (LangGraph has no worker
    of its own that would notice)."""
    def work(s: Loop) -> dict:
        time.sleep(CRASH_STEP_SECONDS)
        record_effect(log, s["i"])
        return {"i": s["i"] + 1}

    checkpointer, close = saver(store, pool_size=2)
    graph = loop_graph(work, checkpointer)
    config = {"configurable": {"thread_id": "crash"}, "recursion_limit": CRASH_STEPS + 10}
    out = graph.invoke(None if resume else {"i": 0, "n": CRASH_STEPS}, config, durability="sync")
    assert out["i"] == CRASH_STEPS, out
    close()
