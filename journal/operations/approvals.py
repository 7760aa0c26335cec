"""Deciding approvals, and the approvals inbox: what people call on an approval a run requested.

``decide()`` is the only way in: it refuses (changing nothing) a closed or expired approval, a
second vote by the same person and an actor without the role; when the outcome is settled it
wakes the run in the same transaction. The request side is ``journal.primitives.approvals``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from journal.models import TERMINAL_STATUSES, Approval, ApprovalDecision, ApprovalStatus, Run
from journal.primitives.approvals import ALWAYS_ALLOWED_ROLE
from journal.store import runstate
from journal.store.doorbell import notify
from journal.store.errors import (
    ApprovalClosedError,
    ApprovalError,
    ApprovalNotFoundError,
    ApprovalPermissionError,
    DuplicateVoteError,
    RunNotFoundError,
)
from journal.store.serialization import check_text, to_json

__all__ = ["ApprovalClosedError", "ApprovalError", "ApprovalNotFoundError", "ApprovalPermissionError",
           "DuplicateVoteError", "decide", "get_approval", "pending_approvals", "run_of"]


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
    check_text(comment, what="the comment")
    check_text(actor, what="the actor", max_length=150)
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
                runstate.lock_for_wake(approval.run_id)
                if runstate.wake(approval.run_id, waiting_for={"kind": "approval", "approval_id": str(approval.id)}):
                    notify(approval.run_id)
    except IntegrityError:
        raise DuplicateVoteError(f"{actor} already decided approval {approval_id}") from None
    return Approval.objects.get(id=approval.id)


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
