"""Trace: timing, tokens, cost and status of each step, model call and tool call, as a span tree.

Shaped like OpenTelemetry spans so they can be exported; written in batches because the trace
explains what happened but never decides replay (the journal does).
"""

from django.db import models

from journal.models.keys import AppendKey


class SpanKind(models.TextChoices):
    RUN = "run"
    STEP = "step"
    EFFECT = "effect"
    MODEL = "model"
    TOOL = "tool"
    SANDBOX = "sandbox"
    WAIT = "wait"
    COMPENSATION = "compensation"


class TraceSpan(models.Model):
    id = AppendKey(primary_key=True)
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="spans", db_index=False)
    span_id = models.CharField(max_length=32)
    parent_span_id = models.CharField(max_length=32, blank=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=SpanKind.choices, default=SpanKind.STEP)
    position = models.PositiveIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16, default="ok")  # ok | error | replayed
    error = models.TextField(blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(default=0)
    model = models.CharField(max_length=200, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    attributes = models.JSONField(default=dict)

    class Meta:
        ordering = ["run", "started_at", "id"]
        indexes = [
            models.Index(fields=["run", "started_at"], name="span_run_time"),
            # the run page's timeline and Trace tab read a window of step positions of a long run
            models.Index(fields=["run", "position"], name="span_run_position"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.duration_ms:.1f}ms"
