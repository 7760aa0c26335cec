"""Request and response shapes of the HTTP API (they are also its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from ninja import Field, Schema
from pydantic import field_validator

from runs.validation import unstorable


def _storable(value: Any) -> Any:
    """Refuse (422, in the documented shape) what no database column can hold, before the engine is
    called: NUL, lone surrogates, NaN/Infinity, absurd nesting (runs/validation.py)."""
    problem = unstorable(value)
    if problem:
        raise ValueError(problem)
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
