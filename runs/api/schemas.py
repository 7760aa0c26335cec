"""Request and response shapes of the HTTP API (they are also its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Schema
from pydantic import field_validator

from runs.validation import unstorable

UNSTORABLE = "cannot be stored"  # the mark the API's error handler answers with a 400, not a 422


def _storable(value: Any) -> Any:
    """Refuse (400, in the documented shape) what no database column can hold, before the engine is
    called: NUL, lone surrogates, NaN/Infinity, absurd nesting (runs/validation.py)."""
    problem = unstorable(value)
    if problem:
        raise ValueError(f"{UNSTORABLE}: {problem}")
    return value


class ErrorOut(Schema):
    detail: str
    code: str = ""


class StartRunIn(Schema):
    agent: str = Field(..., min_length=1, max_length=200, description="a registered agent (workflow) name")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)

    refuse_unstorable = field_validator("agent", "args", "kwargs")(_storable)


class RunOut(Schema):
    run_id: str
    agent: str
    version: str
    status: str
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    output: Any = None
    error: str = ""
    waiting_for: dict[str, Any] | None = None
    wake_at: datetime | None = None
    parent_id: str | None = None
    steps: int = 0
    paused: bool = False
    attention_reason: str = ""
    forked_from: str | None = None
    fork_step: int | None = None


class SignalIn(Schema):
    name: str = Field(..., min_length=1, max_length=200)
    payload: Any = None
    signal_id: str = Field("", max_length=200, description="idempotency key: the same id is accepted once")

    refuse_unstorable = field_validator("name", "payload", "signal_id")(_storable)


class SignalOut(Schema):
    run_id: str
    name: str
    signal_id: str
    accepted_at: datetime
    consumed: bool


class WebhookSignalIn(SignalIn):
    run_id: UUID


class DecisionIn(Schema):
    approved: bool
    comment: str = Field("", max_length=10_000)
    edited: Any = Field(None, description="a corrected value the workflow receives with the decision")

    refuse_unstorable = field_validator("comment", "edited")(_storable)


class DecisionOut(Schema):
    approver: str
    approved: bool
    comment: str
    edited: Any = None
    decided_at: datetime


class ApprovalOut(Schema):
    approval_id: str
    run_id: str
    agent: str
    position: int
    prompt: str
    context: Any = None
    role: str
    quorum: int
    status: str
    requested_at: datetime
    expires_at: datetime | None = None
    decisions: list[DecisionOut] = Field(default_factory=list)


class RunSummaryOut(Schema):
    """A row of the runs list (what the runs page shows; output and input are read with GET /runs/{id})."""

    run_id: str
    agent: str
    version: str
    status: str
    paused: bool = False
    steps: int = 0
    progress: Any = None
    tokens: int = 0
    cost: float = 0.0
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str = ""
    attention_reason: str = ""
    parent_id: str | None = None
    forked_from: str | None = None


class RunPageOut(Schema):
    runs: list[RunSummaryOut]
    next: str | None = Field(None, description="pass as ?cursor= for the next page; null on the last page")


class EventOut(Schema):
    seq: int
    kind: str
    position: int | None = None
    step_name: str = ""
    actor: str = ""
    created_at: datetime
    payload: Any = None


class EventPageOut(Schema):
    run_id: str
    events: list[EventOut]
    next: int | None = Field(None, description="pass as ?after= for the next page; null when no more events yet")


class StepStateOut(Schema):
    run_id: str
    position: int
    total: int
    record: dict[str, Any]
    result: Any = None
    error: Any = None
    state: Any = None
    files: dict[str, str] = Field(default_factory=dict)
    diff: dict[str, Any] = Field(default_factory=dict)


class ReasonIn(Schema):
    reason: str = Field("", max_length=2000, description="recorded with the action and in the audit log")

    refuse_unstorable = field_validator("reason")(_storable)


class ForkIn(Schema):
    at_step: int = Field(..., ge=1, le=2**63 - 1, description="1-based step position to fork from")
    override: Any = Field(None, description="a result recorded for step at_step instead of executing it (a "
                                            "what-if); omitted or null: re-run from that step")
    state: dict[str, Any] | None = Field(None, description="the explicit state (ctx.state) the workflow holds "
                                                           "when step at_step begins, instead of what its "
                                                           "replayed code set (LangGraph's update_state on a "
                                                           "past checkpoint); omitted or null: as recorded")
    reason: str = Field("", max_length=2000)

    refuse_unstorable = field_validator("override", "state", "reason")(_storable)


class ResolveIn(Schema):
    action: Literal["done", "retry", "skip"] = Field(..., description="done: it happened (result is recorded as "
                                                                    "its result); retry: execute it again under the "
                                                                    "same idempotency key; skip: it did not happen")
    result: Any = Field(None, description="only with action=done")
    comment: str = Field("", max_length=2000)

    refuse_unstorable = field_validator("result", "comment")(_storable)


class DivergenceOut(Schema):
    position: int
    expected: str
    got: str
    detail: str = ""


class ReplayCheckOut(Schema):
    run_id: str
    ok: bool
    divergence: DivergenceOut | None = None
    checked: int = 0
    recorded: int = 0
    outcome: str = ""
