"""Harness: what drives an agent (a registered program version) and the worker processes driving runs."""

from django.db import models
from django.utils import timezone


class Harness(models.Model):
    """One registered version of a workflow; runs record which one they started on."""

    name = models.CharField(max_length=200)
    version = models.CharField(max_length=64)
    fingerprint = models.CharField(max_length=64)  # hash of the workflow's source: code changes show up here
    module = models.CharField(max_length=300, blank=True)
    description = models.TextField(blank=True)
    durability = models.CharField(max_length=8, default="sync")
    checkpoint_policy = models.CharField(max_length=12, default="selective")
    registered_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "version", "fingerprint"], name="harness_unique")]
        ordering = ["name", "-registered_at"]
        verbose_name_plural = "harnesses"

    def __str__(self) -> str:
        return f"{self.name}@{self.version} ({self.fingerprint[:8]})"


class WorkerKind(models.TextChoices):
    EMBEDDED = "embedded"  # manage.py runworker
    CELERY = "celery"  # celery -A durable_ui worker


class Worker(models.Model):
    """A live process that claims runs; its heartbeat tells operators (and the sweeper) it is alive."""

    id = models.CharField(primary_key=True, max_length=200)  # hostname:pid:random
    kind = models.CharField(max_length=12, choices=WorkerKind.choices, default=WorkerKind.EMBEDDED)
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    runs_completed = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-heartbeat_at"]
        indexes = [models.Index(fields=["-heartbeat_at"], name="worker_heartbeat")]

    def __str__(self) -> str:
        return self.id


class AgentPause(models.Model):
    """An agent frozen by an operator: its live runs are paused and runs started meanwhile start paused."""

    agent = models.CharField(max_length=200, unique=True)
    paused_by = models.CharField(max_length=150, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.agent} paused by {self.paused_by or '?'}"
