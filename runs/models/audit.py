"""Audit log: every operator action taken through the dashboard, besides the engine's own session event.

The engine records *that* something happened to a run (with the actor); this log answers the
operator's question "who did what, when, why, and did it work" across all runs, including
actions that the engine refused (which leave no session event).
"""

from django.db import models
from django.dispatch import receiver
from django.utils import timezone

from journal.models import MARKER_TEXT, run_erased


class AuditEntry(models.Model):
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=40)  # cancel, retry, fork, approve, signal, role_change, ...
    run_id = models.UUIDField(null=True, blank=True, db_index=True)  # not a FK: the log outlives retention
    target = models.CharField(max_length=300, blank=True)  # what else it touched: an agent, a user, an effect
    comment = models.TextField(blank=True)
    ok = models.BooleanField(default=True)
    result = models.TextField(blank=True)  # what the engine answered (new run id, error message)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["-created_at", "-id"], name="audit_recent")]
        # The dashboard's three capabilities; runs.roles grants them to the viewer/operator/admin groups.
        permissions = [
            ("view_runs", "Can view runs, journals and workers"),
            ("act_on_runs", "Can act on runs (approve, signal, cancel, fork ...)"),
            ("manage_settings", "Can change dashboard settings and roles"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.run_id or self.target}"


@receiver(run_erased, dispatch_uid="runs.audit.scrub_erased_runs")
def scrub_erased_runs(sender, *, run_ids: list[str], **kwargs) -> None:
    """An erasure reaches the audit log too, in its own transaction: the comments and answers recorded
    about the erased runs may quote their data; who did what, when and whether it worked stays."""
    entries = AuditEntry.objects.filter(run_id__in=run_ids)
    entries.exclude(comment="").update(comment=MARKER_TEXT)
    entries.exclude(result="").update(result=MARKER_TEXT)
