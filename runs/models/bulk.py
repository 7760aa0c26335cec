"""A bulk action on every run matching a search, done in the background with its progress kept here.

The row is the job's whole state (what to do, where it got to, what it counted), so a web restart
loses nothing: the next look at its progress page finds the job's heartbeat stale and carries on
from its cursor. Runs are walked in (created_at, id) order up to the moment the job was made, so
runs started afterwards are not swept in.
"""

import uuid

from django.db import models
from django.utils import timezone

__all__ = ["BulkJob", "BulkJobStatus"]


class BulkJobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    BROKEN = "broken"  # the job itself failed (not a run's action): the message says why


class BulkJob(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=20)
    reason = models.TextField(blank=True)
    params = models.JSONField(default=dict)  # the filter as the list page sent it: {"q": [...], "status": [...]}
    search = models.CharField(max_length=300, blank=True)  # what was typed, for the page
    status = models.CharField(max_length=10, choices=BulkJobStatus.choices, default=BulkJobStatus.QUEUED)
    total = models.PositiveIntegerField(default=0)  # runs matching when the job was made
    done = models.PositiveIntegerField(default=0)
    requested = models.PositiveIntegerField(default=0)  # cancellation requested of a running run
    refused = models.PositiveIntegerField(default=0)  # the run's state refuses the action: counted, not an error
    failed = models.PositiveIntegerField(default=0)
    refusals = models.JSONField(default=list)  # [[run id, why], ...] the first REFUSALS_LISTED of them
    refused_by_reason = models.JSONField(default=dict)  # {why: n}
    failures = models.JSONField(default=list)  # [[run id, message], ...] the first FAILURES_LISTED
    message = models.TextField(blank=True)
    # The walk: runs created up to ``created_at``, after (cursor_created, cursor_id).
    cursor_created = models.DateTimeField(null=True, blank=True)
    cursor_id = models.UUIDField(null=True, blank=True)
    owner = models.CharField(max_length=64, blank=True)  # the thread working on it
    heartbeat = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} on {self.total} runs ({self.status})"

    @property
    def processed(self) -> int:
        return self.done + self.requested + self.refused + self.failed

    @property
    def percent(self) -> int:
        if self.status == BulkJobStatus.FINISHED:
            return 100
        return min(100, round(100 * self.processed / self.total)) if self.total else 0

    @property
    def finished(self) -> bool:
        return self.status in (BulkJobStatus.FINISHED, BulkJobStatus.BROKEN)
