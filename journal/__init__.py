"""durable-ui's engine: agents as plain Python functions whose every step is journaled.

The public API (stable; see DESIGN.md)::

    import journal

    @journal.step(retries=3)
    def fetch(url): ...

    @journal.workflow(name="checkout", version="1")
    def checkout(ctx: journal.Context, order_id: str) -> dict: ...

    run_id = journal.start("checkout", "order-7")
    journal.signal(run_id, "approval", {"approved": True})
    run = journal.wait(run_id, timeout=30)

Models cannot be imported before Django's app registry is ready, so the functions that touch
the database are loaded lazily on first use.
"""

from journal.context import Context, current
from journal.decorators import step, workflow
from journal.errors import (
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
    "compensate",
    "current",
    "decide",
    "fork",
    "get_run",
    "pause",
    "pause_agent",
    "replay_check",
    "resolve_effect",
    "resume",
    "retry",
    "signal",
    "start",
    "start_run",
    "state_at",
    "step",
    "unpause",
    "unpause_agent",
    "wait",
    "workflow",
]

_LAZY = {
    "start": "journal.api",
    "start_run": "journal.api",
    "signal": "journal.api",
    "wait": "journal.api",
    "cancel": "journal.api",
    "get_run": "journal.api",
    "fork": "journal.timetravel",
    "replay_check": "journal.timetravel",
    "state_at": "journal.timetravel",
    "pause": "journal.operator",
    "unpause": "journal.operator",
    "pause_agent": "journal.operator",
    "unpause_agent": "journal.operator",
    "retry": "journal.operator",
    "resume": "journal.operator",
    "resolve_effect": "journal.operator",
    "compensate": "journal.compensation",
    "decide": "journal.approvals",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'journal' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
