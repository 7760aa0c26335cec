"""The effect ledger: one row per side effect, keyed so an effect never runs twice for a run."""

from django.db import models
from django.db.models import Q
from django.utils import timezone


class EffectStatus(models.TextChoices):
    STARTED = "started"  # intent committed; outcome unknown until completed/failed is committed
    COMPLETED = "completed"  # result committed with its step_completed event
    FAILED = "failed"  # raised; the outside system did not take it (or the step said so)
    COMPENSATED = "compensated"  # undone by its compensation
    SKIPPED = "skipped"  # an operator resolved an in-doubt effect by skipping it


class SideEffect(models.Model):
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="effects")
    position = models.PositiveIntegerField()
    step_name = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=200, unique=True)
    epoch = models.PositiveBigIntegerField()  # the fencing token the effect was handed
    status = models.CharField(max_length=12, choices=EffectStatus.choices, default=EffectStatus.STARTED)
    args = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=1)
    compensation = models.CharField(max_length=300, blank=True)  # dotted path of the compensating step
    compensation_result = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    compensated_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [models.UniqueConstraint(fields=["run", "position"], name="effect_run_position")]
        indexes = [
            models.Index(fields=["status"], name="effect_in_doubt", condition=Q(status=EffectStatus.STARTED)),
        ]

    def __str__(self) -> str:
        return f"{self.step_name} {self.idempotency_key} ({self.status})"
