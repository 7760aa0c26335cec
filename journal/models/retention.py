"""Retention rules: how long finished runs (and their whole session log) are kept."""

from django.db import models
from django.utils import timezone


class RetentionRule(models.Model):
    """Keep finished runs of ``agent`` (blank: every agent) in ``status`` (blank: every finished
    status) for ``keep_days`` after they finished. The most specific matching rule decides."""

    agent = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, blank=True)
    keep_days = models.PositiveIntegerField()
    created_by = models.CharField(max_length=150, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["agent", "status"]
        constraints = [models.UniqueConstraint(fields=["agent", "status"], name="retention_rule_unique")]

    def __str__(self) -> str:
        return f"{self.agent or 'every agent'} / {self.status or 'every finished status'}: {self.keep_days} days"

    @property
    def specificity(self) -> int:
        return (2 if self.agent else 0) + (1 if self.status else 0)
