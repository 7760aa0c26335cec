"""Approvals: a person's decision as a first-class record, not a bare signal.

An approval keeps what the approver was shown (prompt, context), who may decide (role), how
many distinct people must agree (quorum), and what happens if nobody decides in time. Each
vote is an ApprovalDecision row (who, when, comment, edited value), so the audit trail
survives whatever the workflow does with the outcome.
"""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"  # waiting for decisions from its role
    ESCALATED = "escalated"  # expired once and handed to another role; still open
    APPROVED = "approved"  # quorum reached
    REJECTED = "rejected"  # one rejection decides
    EXPIRED = "expired"  # nobody decided in time; on_expiry said reject or fail


OPEN_APPROVAL_STATUSES = frozenset({ApprovalStatus.PENDING, ApprovalStatus.ESCALATED})


class ApprovalQuerySet(models.QuerySet):
    def open(self):
        return self.filter(status__in=OPEN_APPROVAL_STATUSES)


class Approval(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="approvals")
    position = models.PositiveIntegerField()  # the step position of the request in the run's journal
    prompt = models.TextField()
    context = models.JSONField(null=True, blank=True)  # what the approver is shown besides the prompt
    role = models.CharField(max_length=80, default="operator")
    quorum = models.PositiveSmallIntegerField(default=1)  # distinct approvers needed
    on_expiry = models.CharField(max_length=120, default="reject")  # reject | fail | escalate:<role>
    timeout_seconds = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    requested_by = models.CharField(max_length=150, blank=True)  # the agent (and worker) that asked
    requested_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["requested_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="approval_one_per_position"),
            models.CheckConstraint(condition=Q(quorum__gte=1), name="approval_quorum_positive"),
        ]
        indexes = [
            models.Index(fields=["requested_at"], name="approval_open",
                         condition=Q(status__in=["pending", "escalated"])),
        ]

    def __str__(self) -> str:
        return f"approval {self.id} ({self.status}) for run {self.run_id}"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_APPROVAL_STATUSES


class ApprovalDecision(models.Model):
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="decisions")
    approver = models.CharField(max_length=150)
    approved = models.BooleanField()
    comment = models.TextField(blank=True)
    edited = models.JSONField(null=True, blank=True)  # the approver's corrected value, if any
    decided_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["decided_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "approver"], name="approval_one_vote_per_person"),
        ]

    def __str__(self) -> str:
        return f"{self.approver}: {'approve' if self.approved else 'reject'}"
