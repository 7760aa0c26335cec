"""durable-ui's engine: agents as plain Python functions whose every step is journaled.

The public API (stable; the README's "The engine in one screen" and "Glossary")::

    import journal

    @journal.step(retries=3)
    def fetch(url): ...

    @journal.workflow(name="checkout", version="1")
    def checkout(ctx: journal.Context, order_id: str) -> dict: ...

    run_id = journal.start("checkout", "order-7")
    journal.signal(run_id, "approval", {"approved": True})
    run = journal.wait(run_id, timeout=30)

The engine is a house with floors whose imports point down only (``lint-imports`` checks it)::

    integrations   Celery tasks, system checks, agent discovery, admin, management commands
    operations     what operators and engineers call: start/signal/wait/cancel, operator actions, time travel
    driver         executor, leases, worker, saga, the in-memory replayer
    primitives     what workflow code calls: Context, steps, effects, waits, approvals, children, models, sandbox
    engine         registry, the replay protocol, the history model, checkpoints
    store          errors, serialization, blobs, the fenced writer, the one owner of a run's state; models

Every name here is loaded on first use: ``journal`` is imported while Django loads its apps,
before models can be, so this module imports nothing that touches them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers follow; at run time the table below loads them
    from journal.operations.approvals import decide
    from journal.operations.compensation import compensate
    from journal.operations.erasure import erase, preview_erasure
    from journal.operations.operator import pause, pause_agent, resolve_effect, resume, retry, unpause, unpause_agent
    from journal.operations.runs import cancel, get_run, signal, start, start_run, wait
    from journal.operations.threads import checkpoint_state, fork_thread, has_thread, thread_checkpoints, thread_total
    from journal.operations.timetravel import fork, replay_check, state_at
    from journal.primitives.context import Context, current
    from journal.primitives.decorators import step, workflow
    from journal.store.errors import (
        BadArgumentsError,
        Cancelled,
        DurableError,
        EffectInDoubtError,
        NondeterminismError,
        PayloadTooLargeError,
        RunNotFoundError,
        RunStateError,
        SerializationError,
        SignalError,
        StepError,
        UnknownAgentError,
        WaitTimeout,
        WorkflowDefinitionError,
    )

_ERRORS = "journal.store.errors"
_PUBLIC: dict[str, str] = {
    "step": "journal.primitives.decorators",
    "workflow": "journal.primitives.decorators",
    "Context": "journal.primitives.context",
    "current": "journal.primitives.context",
    "start": "journal.operations.runs",
    "start_run": "journal.operations.runs",
    "signal": "journal.operations.runs",
    "wait": "journal.operations.runs",
    "cancel": "journal.operations.runs",
    "get_run": "journal.operations.runs",
    "fork": "journal.operations.timetravel",
    "replay_check": "journal.operations.timetravel",
    "state_at": "journal.operations.timetravel",
    **{name: "journal.operations.threads" for name in (
        "checkpoint_state", "fork_thread", "has_thread", "thread_checkpoints", "thread_total")},
    "pause": "journal.operations.operator",
    "unpause": "journal.operations.operator",
    "pause_agent": "journal.operations.operator",
    "unpause_agent": "journal.operations.operator",
    "retry": "journal.operations.operator",
    "resume": "journal.operations.operator",
    "resolve_effect": "journal.operations.operator",
    "compensate": "journal.operations.compensation",
    "decide": "journal.operations.approvals",
    "erase": "journal.operations.erasure",
    "preview_erasure": "journal.operations.erasure",
    "is_database_outage": "journal.store.outage",  # for work outside a run that must outlast an outage
    **{name: _ERRORS for name in (
        "BadArgumentsError", "Cancelled", "DurableError", "EffectInDoubtError", "NondeterminismError",
        "PayloadTooLargeError", "RunNotFoundError", "RunStateError", "SerializationError", "SignalError",
        "StepError", "UnknownAgentError", "WaitTimeout", "WorkflowDefinitionError")},
}

__all__ = [
    "BadArgumentsError",
    "Cancelled",
    "Context",
    "DurableError",
    "EffectInDoubtError",
    "NondeterminismError",
    "PayloadTooLargeError",
    "RunNotFoundError",
    "RunStateError",
    "SerializationError",
    "SignalError",
    "StepError",
    "UnknownAgentError",
    "WaitTimeout",
    "WorkflowDefinitionError",
    "cancel",
    "checkpoint_state",
    "compensate",
    "current",
    "decide",
    "erase",
    "fork",
    "fork_thread",
    "get_run",
    "has_thread",
    "is_database_outage",
    "pause",
    "pause_agent",
    "preview_erasure",
    "replay_check",
    "resolve_effect",
    "resume",
    "retry",
    "signal",
    "start",
    "start_run",
    "state_at",
    "step",
    "thread_checkpoints",
    "thread_total",
    "unpause",
    "unpause_agent",
    "wait",
    "workflow",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'journal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
