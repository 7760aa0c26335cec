"""The signal inbox: signals are durable the moment they are accepted, even before the run waits for them."""

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Signal(models.Model):
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    signal_id = models.CharField(max_length=200, blank=True)  # caller's idempotency key
    actor = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_position = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "signal_id"], name="signal_idempotent", condition=~Q(signal_id="")
            ),
        ]
        indexes = [
            models.Index(fields=["run", "name"], name="signal_pending", condition=Q(consumed_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.name} -> {self.run_id}"
