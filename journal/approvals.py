"""Human approvals: ``ctx.request_approval`` suspends a run until people with the right role decide.

Why a record and not a bare signal: an approval has to show the approver what they are
deciding (prompt, context), restrict who may decide (role), count distinct people (quorum)
and say what happens when nobody does (``on_expiry``). Those facts live in ``Approval`` and
``ApprovalDecision`` rows; the run's journal records the request (a marker holding the
approval id, written in the same transaction that creates the row) and, when the workflow
resumes, the outcome at the request's position, so replay returns the same decision.

``decide()`` is the only way in: it refuses (changing nothing) a closed or expired approval, a
second vote by the same person and an actor without the role; when the outcome is settled it
wakes the run in the same transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from journal.dispatch import lock_for_wake, notify
from journal.errors import DurableError, RunNotFoundError, Suspend, WaitTimeout
from journal.models import (
    OPEN_APPROVAL_STATUSES,
    TERMINAL_STATUSES,
    Approval,
    ApprovalDecision,
    ApprovalStatus,
    EventKind,
    Run,
    RunStatus,
)
from journal.replay import lookup
from journal.serialization import to_json

STEP_NAME = "approval"
ALWAYS_ALLOWED_ROLE = "admin"


class ApprovalError(DurableError):
    """A decision was refused (closed approval, second vote, wrong role); nothing was recorded."""


class ApprovalNotFoundError(ApprovalError, LookupError):
    pass


class ApprovalClosedError(ApprovalError):
    """The approval was already decided or expired."""


class DuplicateVoteError(ApprovalError):
    """This person already voted on this approval."""


class ApprovalPermissionError(ApprovalError, PermissionError):
    """The actor does not hold the role the approval asks for."""


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
    ctx.check_interrupts()
    position = ctx.next_position()
    record = lookup(ctx, position, STEP_NAME)
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


def _lock(approval_id) -> Approval:
    qs = Approval.objects.filter(id=approval_id)
    if connection.vendor == "postgresql":
        qs = qs.select_for_update()
    approval = qs.first()
    if approval is None:
        raise ApprovalNotFoundError(f"no approval with id {approval_id!r}")
    return approval


def decide(approval_id, *, approved: bool, actor: str, actor_roles: set[str] | None = None, comment: str = "",
           edited: Any = None) -> Approval:
    """Record one person's vote; wakes the run once the outcome is settled.

    Refuses, recording nothing: an unknown, decided or expired approval; a second vote by the
    same ``actor``; an actor whose ``actor_roles`` (when given) lack the approval's role
    ("admin" may always decide).
    """
    if not isinstance(approved, bool):
        raise ApprovalError("approved must be true or false")
    if not isinstance(actor, str) or not actor.strip():
        raise ApprovalError("a decision needs the actor who made it")
    if not isinstance(comment, str):
        raise ApprovalError("a comment must be text")
    try:
        uuid.UUID(str(approval_id))
    except ValueError:
        raise ApprovalNotFoundError(f"no approval with id {approval_id!r}") from None
    edited = to_json(edited, what="the edited value")
    now = timezone.now()
    try:
        with transaction.atomic():
            approval = _lock(approval_id)
            if not approval.is_open:
                raise ApprovalClosedError(f"approval {approval.id} is already {approval.status}")
            run_status = Run.objects.filter(id=approval.run_id).values_list("status", flat=True).first()
            if run_status in TERMINAL_STATUSES:
                raise ApprovalClosedError(f"run {approval.run_id} is {run_status}; its approval can no longer "
                                          "be decided")
            if approval.expires_at is not None and now >= approval.expires_at:
                raise ApprovalClosedError(f"approval {approval.id} expired at {approval.expires_at.isoformat()}")
            if actor_roles is not None and approval.role not in actor_roles and ALWAYS_ALLOWED_ROLE not in actor_roles:
                raise ApprovalPermissionError(f"{actor} may not decide this approval: it needs the role "
                                              f"{approval.role!r}")
            ApprovalDecision.objects.create(approval=approval, approver=actor, approved=approved,
                                            comment=comment, edited=edited, decided_at=now)
            status = None
            if not approved:
                status = ApprovalStatus.REJECTED
            elif approval.decisions.filter(approved=True).count() >= approval.quorum:
                status = ApprovalStatus.APPROVED
            if status is not None:
                Approval.objects.filter(id=approval.id).update(status=status, decided_at=now)
                lock_for_wake(approval.run_id)
                woke = Run.objects.filter(
                    id=approval.run_id, status=RunStatus.SUSPENDED, waiting_for__kind="approval",
                    waiting_for__approval_id=str(approval.id),
                ).update(status=RunStatus.PENDING, wake_at=None)
                if woke:
                    notify(approval.run_id)
    except IntegrityError:
        raise DuplicateVoteError(f"{actor} already decided approval {approval_id}") from None
    return Approval.objects.get(id=approval.id)


def after_suspend(ctx, waiting_for: dict, final: list) -> None:
    """Inside the suspension's transaction: a decision made while the run was still running wakes it."""
    approval_id = waiting_for.get("approval_id")
    if approval_id and not Approval.objects.filter(id=approval_id, status__in=OPEN_APPROVAL_STATUSES).exists():
        Run.objects.filter(id=ctx.run.id, epoch=ctx.epoch).update(status=RunStatus.PENDING, wake_at=None)
        final[0] = RunStatus.PENDING


def pending_approvals() -> QuerySet:
    """Open approvals of runs that can still use them, oldest first: the inbox."""
    return (Approval.objects.open().exclude(run__status__in=TERMINAL_STATUSES).select_related("run")
            .order_by("requested_at", "id"))


def get_approval(approval_id) -> Approval:
    try:
        return Approval.objects.select_related("run").get(id=approval_id)
    except (Approval.DoesNotExist, ValueError, TypeError):
        raise ApprovalNotFoundError(f"no approval with id {approval_id!r}") from None


def run_of(approval_id) -> Run:
    approval = get_approval(approval_id)
    if approval.run is None:
        raise RunNotFoundError(f"approval {approval_id} has no run")
    return approval.run
