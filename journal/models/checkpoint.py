"""Checkpoint: what the next worker reads on resume that the journal alone cannot rebuild.

Files live once in the content-addressed Blob store (deduplicated across steps and runs,
compressed); a Checkpoint is a manifest of path -> hash plus explicit agent state.
"""

from django.db import models
from django.utils import timezone

from journal.models.keys import AppendKey


class Blob(models.Model):
    sha256 = models.CharField(primary_key=True, max_length=64)
    size = models.PositiveBigIntegerField()  # uncompressed bytes
    stored_size = models.PositiveBigIntegerField()  # bytes as stored (compressed)
    compression = models.CharField(max_length=8, default="zlib")
    data = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.sha256[:12]


class CheckpointDecision(models.TextChoices):
    TAKEN = "taken"
    SKIPPED = "skipped"


class Checkpoint(models.Model):
    id = AppendKey(primary_key=True)
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="checkpoints")
    position = models.PositiveIntegerField()  # the step after which it was taken (or skipped)
    step_name = models.CharField(max_length=200, blank=True)
    decision = models.CharField(max_length=8, choices=CheckpointDecision.choices, default=CheckpointDecision.TAKEN)
    reason = models.CharField(max_length=200, blank=True)  # why taken or skipped
    manifest = models.JSONField(default=dict)  # {"path": "sha256", ...}; empty for a skipped step
    state = models.JSONField(null=True, blank=True)  # explicit agent state
    bytes_written = models.PositiveBigIntegerField(default=0)  # new blob bytes this checkpoint stored
    files_changed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "position"]
        indexes = [models.Index(fields=["run", "decision", "position"], name="checkpoint_run_position")]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.position} {self.decision}"
