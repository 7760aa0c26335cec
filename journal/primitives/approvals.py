"""Human approvals: ``ctx.request_approval`` suspends a run until people with the right role decide.

Why a record and not a bare signal: an approval has to show the approver what they are
deciding (prompt, context), restrict who may decide (role), count distinct people (quorum)
and say what happens when nobody does (``on_expiry``). Those facts live in ``Approval`` and
``ApprovalDecision`` rows; the run's journal records the request (a marker holding the
approval id, written in the same transaction that creates the row) and, when the workflow
resumes, the outcome at the request's position, so replay returns the same decision.

Deciding is ``journal.operations.approvals.decide()``: it refuses (changing nothing) a closed or
expired approval, a second vote by the same person and an actor without the role; when the
outcome is settled it wakes the run in the same transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.engine.protocol import begin
from journal.models import (
    OPEN_APPROVAL_STATUSES,
    Approval,
    ApprovalStatus,
    EventKind,
    RunStatus,
)
from journal.store import runstate
from journal.store.errors import DurableError, Suspend, WaitTimeout
from journal.store.serialization import to_json

STEP_NAME = "approval"
ALWAYS_ALLOWED_ROLE = "admin"


class ApprovalExpired(WaitTimeout):  # noqa: N818 - reads as an outcome: "the approval expired"
    """Raised in the workflow when an approval with ``on_expiry="fail"`` expires."""


def _validate_on_expiry(on_expiry: str) -> None:
    if on_expiry in ("reject", "fail"):
        return
    if on_expiry.startswith("escalate:") and on_expiry.split(":", 1)[1].strip():
        return
    raise DurableError(f"on_expiry must be 'reject', 'fail' or 'escalate:<role>', not {on_expiry!r}")


def _seconds(timeout: timedelta | float | None) -> float | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if seconds <= 0:
        raise DurableError("an approval timeout must be positive")
    return seconds


def decision_of(approval: Approval) -> dict:
    """The value ``request_approval`` returns: who decided, when, what they said."""
    decisions = list(approval.decisions.order_by("decided_at", "id"))
    rejecting = [d for d in decisions if not d.approved]
    deciding = rejecting[:1] if rejecting else [d for d in decisions if d.approved]
    edited = next((d.edited for d in reversed(deciding) if d.edited is not None), None)
    comments = [d.comment for d in deciding if d.comment]
    return {
        "approved": approval.status == ApprovalStatus.APPROVED,
        "status": str(approval.status),
        "decided_by": [d.approver for d in deciding],
        "decided_at": (approval.decided_at or timezone.now()).isoformat(),
        "comment": "\n".join(comments),
        "edited": edited,
        "approval_id": str(approval.id),
    }


def _outcome(payload: dict) -> dict:
    """Same on first execution and on replay: an expired approval with on_expiry=fail raises."""
    result = payload.get("result") or {}
    if result.get("status") == ApprovalStatus.EXPIRED and payload.get("on_expiry") == "fail":
        raise ApprovalExpired(f"approval {result.get('approval_id')} expired without a decision "
                              f"(step {payload.get('position')})")
    return result


def request_approval(ctx, prompt: str, *, timeout: timedelta | float | None = None, role: str = "operator",
                     context: Any = None, quorum: int = 1, on_expiry: str = "reject") -> dict:
    """Suspend until ``quorum`` distinct people with ``role`` approve, or one rejects; returns the decision."""
    position, record = begin(ctx, STEP_NAME)
    if record is not None:
        return _outcome(record["payload"])
    if not isinstance(prompt, str) or not prompt.strip():
        raise DurableError("an approval needs a non-empty prompt")
    if not isinstance(quorum, int) or quorum < 1:
        raise DurableError("an approval quorum must be a positive integer")
    _validate_on_expiry(on_expiry)
    seconds = _seconds(timeout)
    marker = ctx.markers.get(position, {}).get(EventKind.APPROVAL_REQUESTED)
    if marker is None:
        marker = _create(ctx, position, prompt, role, to_json(context, what="the approval context"), quorum,
                         on_expiry, seconds)
    approval = Approval.objects.get(id=marker["approval_id"])
    approval = _expire_if_due(approval)
    if not approval.is_open:
        return _settle(ctx, position, approval)
    raise Suspend({"kind": "approval", "approval_id": str(approval.id), "position": position,
                   "prompt": approval.prompt[:500], "role": approval.role,
                   "deadline": approval.expires_at.isoformat() if approval.expires_at else None},
                  wake_at=approval.expires_at)


def _create(ctx, position: int, prompt: str, role: str, context: Any, quorum: int, on_expiry: str,
            seconds: float | None) -> dict:
    approval_id = uuid.uuid4()
    now = timezone.now()
    expires_at = now + timedelta(seconds=seconds) if seconds is not None else None
    marker = {"approval_id": str(approval_id), "prompt": prompt[:2000], "role": role, "quorum": quorum,
              "on_expiry": on_expiry, "expires_at": expires_at.isoformat() if expires_at else None}

    def create() -> None:
        Approval.objects.create(id=approval_id, run_id=ctx.run.id, position=position, prompt=prompt,
                                context=context, role=role, quorum=quorum, on_expiry=on_expiry,
                                timeout_seconds=seconds, requested_by=f"{ctx.agent}@{ctx.worker_id}",
                                requested_at=now, expires_at=expires_at)

    ctx.writer.record(EventKind.APPROVAL_REQUESTED, marker, position=position, step_name=STEP_NAME,
                      actor=ctx.worker_id, extra=create)
    ctx.markers.setdefault(position, {})[EventKind.APPROVAL_REQUESTED] = marker
    return marker


def _expire_if_due(approval: Approval, now: datetime | None = None) -> Approval:
    """Apply the declared expiry outcome once; a concurrent decide() and expiry cannot both win."""
    now = now or timezone.now()
    if not approval.is_open or approval.expires_at is None or now < approval.expires_at:
        return approval
    with transaction.atomic():
        open_qs = Approval.objects.filter(id=approval.id, status__in=OPEN_APPROVAL_STATUSES,
                                          expires_at__lte=now)
        if approval.on_expiry.startswith("escalate:"):
            seconds = approval.timeout_seconds or 0
            open_qs.update(status=ApprovalStatus.ESCALATED, role=approval.on_expiry.split(":", 1)[1].strip(),
                           on_expiry="reject",
                           expires_at=now + timedelta(seconds=seconds) if seconds else None)
        else:
            open_qs.update(status=ApprovalStatus.EXPIRED, decided_at=now)
    return Approval.objects.get(id=approval.id)


def _settle(ctx, position: int, approval: Approval) -> dict:
    decision = decision_of(approval)
    payload = {"result": decision, "kind": "approval", "approval_id": str(approval.id), "position": position,
               "on_expiry": approval.on_expiry}
    actor = ", ".join(decision["decided_by"])[:150]
    ctx.writer.record(EventKind.APPROVAL_DECIDED, {**decision, "position": position}, position=position,
                      step_name=STEP_NAME, actor=actor, durability="exit")
    ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=position, step_name=STEP_NAME, actor=actor,
                      durability="sync")
    return _outcome(payload)


def after_suspend(ctx, waiting_for: dict, final: list) -> None:
    """Inside the suspension's transaction: a decision made while the run was still running wakes it."""
    approval_id = waiting_for.get("approval_id")
    decided = approval_id and not Approval.objects.filter(id=approval_id, status__in=OPEN_APPROVAL_STATUSES).exists()
    if decided and runstate.wake(ctx.run.id, at_epoch=ctx.epoch):
        final[0] = RunStatus.PENDING
