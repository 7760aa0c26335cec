"""Erasure: the durable record of a request to erase a subject's data from the runs that hold it.

An erasure keeps the journal's skeleton (positions, step names, timings, statuses) and replaces
every payload the subject's data can live in with a marker (``journal.operations.erasure``). This
row says who asked, why, when and how much was erased. It keeps the SHA-256 of the subject, never
the subject itself: whoever knows the subject can prove it was erased, the table does not name it.

``run_erased`` is a seam: sent inside the erasure's transaction with the erased run ids, so a
higher layer (the dashboard's audit log) scrubs what it holds about those runs in the same commit.
"""

import uuid

from django.db import models
from django.dispatch import Signal
from django.utils import timezone

# receivers: def receiver(sender, *, run_ids: list[str], erasure: Erasure, **kwargs) -> None
run_erased = Signal()

MARKER_TEXT = "[erased]"  # what a text column holds once erased


class Erasure(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    actor = models.CharField(max_length=150)
    reason = models.TextField()
    subject_sha256 = models.CharField(max_length=64, blank=True, db_index=True)  # blank: erased by run ids
    run_ids = models.JSONField(default=list)  # kept after retention deletes the runs themselves
    runs = models.PositiveIntegerField(default=0)
    events = models.PositiveIntegerField(default=0)  # session events whose payload was replaced
    rows = models.PositiveIntegerField(default=0)  # other rows rewritten (signals, effects, spans, ...)
    files = models.PositiveIntegerField(default=0)  # sandbox files whose content was dropped
    blobs_deleted = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"erasure {self.id} of {self.runs} run(s) by {self.actor}"

    def marker(self) -> dict:
        """What a JSON column holds once erased."""
        return {"erased": True, "erasure_id": str(self.id), "erased_at": self.created_at.isoformat()}
