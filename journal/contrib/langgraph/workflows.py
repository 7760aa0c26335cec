"""A LangGraph graph run *as* a durable-ui run: driven by durable-ui's workers, leased, recovered.

    @graph_workflow(name="researcher")
    def researcher():                  # returns a StateGraph (or a graph compiled with JournalSaver)
        builder = StateGraph(State)
        ...
        return builder

    run_id = start("researcher", {"messages": [...]})    # the thread is the run: thread_id = run_id

The workflow compiles the graph with `JournalSaver` and invokes it on the run's thread. When the
worker dies, the sweeper hands the run to another worker, the workflow runs again from the top,
and the graph resumes the thread from its last checkpoint (its finished nodes, and the pending
writes of a half-finished super-step, are not run again). Whether the graph had already been
given its input is journaled (a step), so a resumed run never feeds the input twice.

A graph's `interrupt(value)` becomes an approval (`ctx.request_approval`): the run suspends,
holding no thread, shows in the approvals inbox, and the decision (approved, comment, edited,
who) is what `interrupt()` returns when the graph resumes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

import journal
from journal.contrib.langgraph.saver import JournalSaver
from journal.models import Approval
from journal.store.errors import WorkflowDefinitionError

DURABILITY = ("sync", "async", "exit")  # LangGraph's names, the same as durable-ui's


def graph_workflow(fn: Callable[[], Any] | None = None, *, name: str | None = None, version: str = "1",
                   durability: str = "sync", description: str = ""):
    """Register a module-level function that builds a graph as a durable-ui workflow.

    `durability` is LangGraph's (and durable-ui's): `sync` writes each checkpoint before the next
    super-step starts, so a crash loses at most the super-step that was running.
    """
    if durability not in DURABILITY:
        raise WorkflowDefinitionError(f"durability must be one of {DURABILITY}")

    def decorate(build: Callable[[], Any]) -> Callable[[], Any]:
        def run_graph(ctx: journal.Context, input: Any = None, *, thread_id: str | None = None) -> Any:
            return run_on_thread(build(), input, thread_id=thread_id or ctx.run_id, durability=durability,
                                 fence=(ctx.run_id, ctx.epoch))

        # The workflow is found again by the builder's name and module; its fingerprint is the
        # builder's code (inspect follows __wrapped__), its signature its own.
        run_graph.__signature__ = inspect.signature(run_graph)  # type: ignore[attr-defined]
        run_graph.__module__, run_graph.__qualname__ = build.__module__, build.__qualname__
        run_graph.__name__, run_graph.__wrapped__ = build.__name__, build  # type: ignore[attr-defined]
        run_graph.__durable_graph__ = build  # type: ignore[attr-defined]  (a fork rebuilds the graph from it)
        journal.workflow(name=name or build.__name__, version=version, durability=durability,
                         description=description or (inspect.getdoc(build) or "").split("\n\n")[0])(run_graph)
        build.__durable_workflow__ = run_graph.__durable_workflow__  # type: ignore[attr-defined]
        return build

    return decorate(fn) if fn is not None else decorate


def start(graph: str | Callable[[], Any], input: Any = None, *, thread_id: str | None = None) -> str:
    """Start a run of a graph registered with `graph_workflow` (by name or builder); returns the run_id.

    Without `thread_id` the run's id is the thread's; with one, the run continues that thread.
    """
    if not isinstance(graph, str):
        defn = getattr(graph, "__durable_workflow__", None)
        if defn is None:
            raise WorkflowDefinitionError(f"{graph!r} is not registered: decorate its builder with @graph_workflow")
        graph = defn.name
    return journal.start(graph, input, **({"thread_id": thread_id} if thread_id else {}))


def compiled(graph: Any, saver: JournalSaver | None = None) -> Any:
    """A graph that checkpoints with JournalSaver (`saver`, or a plain one): a StateGraph is compiled
    with it; a graph compiled with a JournalSaver gets `saver` instead."""
    saver = saver or JournalSaver()
    if hasattr(graph, "compile"):
        return graph.compile(checkpointer=saver)
    if not isinstance(getattr(graph, "checkpointer", None), JournalSaver):
        raise WorkflowDefinitionError("a graph run by durable-ui checkpoints with JournalSaver: return the "
                                      "StateGraph from the builder, or compile it with checkpointer=JournalSaver()")
    return graph.copy(update={"checkpointer": saver})


def run_on_thread(graph: Any, input: Any, *, thread_id: str, durability: str = "sync",
                  fence: tuple[str, int] | None = None) -> Any:
    """Invoke the graph on `thread_id` (or resume it there if this run already gave it its input),
    turning each `interrupt()` into an approval the run waits for; returns the final state.

    `fence=(run_id, epoch)`: the thread is written only while this worker holds the run.
    """
    graph = compiled(graph, JournalSaver(fence=fence))
    config: RunnableConfig = {"configurable": {"thread_id": str(thread_id)}}
    at_start = checkpoint_at_start(str(thread_id))  # journaled: on a resumed run, what it was at the first try
    if latest_checkpoint_id(str(thread_id)) == at_start:
        graph.invoke(input, config, durability=durability)
    else:
        state = graph.get_state(config)
        if state.next and not state.interrupts:  # the dead worker's super-step: run it (and the rest)
            graph.invoke(None, config, durability=durability)
    state = graph.get_state(config)
    while state.interrupts:
        pending = state.interrupts[0]
        decision = journal.current().request_approval(_prompt(pending.value), context={
            "interrupt_id": pending.id, "value": plain(pending.value), "thread_id": str(thread_id)})
        # On a resumed run the approvals recorded earlier replay in order; those whose interrupt the
        # thread has already moved past were applied (the checkpoint says so), not to apply twice.
        if _interrupt_of(decision) == pending.id:
            graph.invoke(Command(resume={pending.id: decision}), config, durability=durability)
            state = graph.get_state(config)
    return plain(state.values)


def _prompt(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, dict):
        for key in ("question", "prompt", "message"):
            if isinstance(value.get(key), str) and value[key].strip():
                return value[key]
    return "The graph is waiting for a human decision"


def _interrupt_of(decision: dict) -> str | None:
    approval = Approval.objects.filter(id=decision.get("approval_id")).first()
    return (approval.context or {}).get("interrupt_id") if approval else None


@journal.step()
def checkpoint_at_start(thread_id: str) -> str | None:
    """The thread's newest checkpoint when the run first reached the graph."""
    return latest_checkpoint_id(thread_id)


def latest_checkpoint_id(thread_id: str) -> str | None:
    latest = JournalSaver().get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    return latest.config["configurable"]["checkpoint_id"] if latest else None


def plain(value: Any) -> Any:
    """The graph's final state as JSON a run's output can hold (messages become their fields)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if hasattr(value, "model_dump"):  # pydantic: LangChain messages, user state models
        return plain(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    return repr(value)
