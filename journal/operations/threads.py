"""Threads of graphs written for other libraries (a LangGraph thread), as the dashboard reads and forks them.

A seam: the engine knows nothing of LangGraph, and ``runs/`` may not import a bridge whose library
may not be installed. A bridge (``journal.contrib.langgraph``) registers a ``ThreadBridge`` when it
is imported, which every process that runs graphs does (their modules import it); without one,
``has_thread`` is False and the rest refuse clearly.
"""

from __future__ import annotations

from typing import Any, Protocol

from journal.models import Run
from journal.operations.runs import get_run
from journal.store.errors import BadArgumentsError


class ThreadBridge(Protocol):
    def has_thread(self, run: Run) -> bool: ...
    def thread_total(self, run: Run) -> int: ...
    def thread_checkpoints(self, run: Run, *, offset: int = 0, limit: int = 50) -> list[dict]: ...
    def checkpoint_state(self, run: Run, *, position: int | None = None,
                         checkpoint_id: str | None = None) -> dict: ...
    def fork_thread(self, run: Run, checkpoint_id: str, values: dict, *, as_node: str | None = None,
                    actor: str = "", reason: str = "") -> str: ...


_bridges: list[ThreadBridge] = []


def register(bridge: ThreadBridge) -> None:
    """Called by a bridge at import (once per class: a re-import does not register twice)."""
    if not any(type(b) is type(bridge) for b in _bridges):
        _bridges.append(bridge)


def _bridge_for(run: Run) -> ThreadBridge | None:
    return next((b for b in _bridges if b.has_thread(run)), None)


def _run(run_id) -> Run:
    return run_id if isinstance(run_id, Run) else get_run(run_id)


def _require(run_id) -> tuple[Run, ThreadBridge]:
    run = _run(run_id)
    bridge = _bridge_for(run)
    if bridge is None:
        raise BadArgumentsError(f"run {run.id} does not drive a LangGraph graph (no thread is stored for it)")
    return run, bridge


def has_thread(run_id) -> bool:
    """True when the run drives a graph whose thread is stored (one indexed lookup per bridge)."""
    return _bridge_for(_run(run_id)) is not None


def thread_total(run_id) -> int:
    """How many checkpoints the run's thread holds."""
    run, bridge = _require(run_id)
    return bridge.thread_total(run)


def thread_checkpoints(run_id, *, offset: int = 0, limit: int = 50) -> list[dict]:
    """A window of the thread's checkpoints in order (position, checkpoint_id, step, source, nodes), no values."""
    run, bridge = _require(run_id)
    return bridge.thread_checkpoints(run, offset=offset, limit=limit)


def checkpoint_state(run_id, *, position: int | None = None, checkpoint_id: str | None = None) -> dict:
    """One checkpoint of the thread (by 1-based position or id): its channel values, the writes and
    nodes that produced it, and the values of the checkpoint it came from (for the diff)."""
    run, bridge = _require(run_id)
    return bridge.checkpoint_state(run, position=position, checkpoint_id=checkpoint_id)


def fork_thread(run_id, checkpoint_id: str, values: dict[str, Any], *, as_node: str | None = None,
                actor: str = "", reason: str = "") -> str:
    """A new run that continues the graph from a past checkpoint with edited values (LangGraph's
    ``update_state`` on that checkpoint, on a copy of the thread): the parent is not changed."""
    run, bridge = _require(run_id)
    return bridge.fork_thread(run, checkpoint_id, values, as_node=as_node, actor=actor, reason=reason)


__all__ = ["ThreadBridge", "checkpoint_state", "fork_thread", "has_thread", "register", "thread_checkpoints",
           "thread_total"]
