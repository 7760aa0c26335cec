"""Sandbox: where an agent's commands execute, and the record of every command it ran."""

from django.db import models
from django.utils import timezone


class Sandbox(models.Model):
    run = models.OneToOneField("journal.Run", on_delete=models.CASCADE, related_name="sandbox")
    root = models.CharField(max_length=500)
    limits = models.JSONField(default=dict)  # timeout, cpu_seconds, memory_bytes, output_bytes, ...
    isolation = models.CharField(max_length=50, default="rlimits")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"sandbox of {self.run_id}"


class SandboxCommand(models.Model):
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="sandbox_commands")
    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="commands")
    position = models.PositiveIntegerField(null=True, blank=True)
    command = models.TextField()  # as the agent sent it
    argv = models.JSONField(default=list)
    cwd = models.CharField(max_length=500, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    stdout = models.TextField(blank=True)
    stderr = models.TextField(blank=True)
    truncated = models.BooleanField(default=False)
    failure_reason = models.CharField(max_length=200, blank=True)  # timeout, memory, path escape, ...
    duration_ms = models.FloatField(default=0)
    files_created = models.JSONField(default=list)
    files_modified = models.JSONField(default=list)
    files_deleted = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "created_at", "id"]
        indexes = [models.Index(fields=["run", "position"], name="sandboxcmd_run_position")]

    def __str__(self) -> str:
        return f"{self.command[:40]} -> {self.exit_code}"
