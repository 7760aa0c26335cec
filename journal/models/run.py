"""Run: ties the five concerns together and carries the lease that decides who may advance it."""

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class RunStatus(models.TextChoices):
    PENDING = "pending"  # runnable; waiting for a worker to claim it
    RUNNING = "running"  # a worker holds its lease and drives it
    SUSPENDED = "suspended"  # waiting for a signal, approval, timer or child; holds no thread
    COMPLETED = "completed"  # returned; output is final
    FAILED = "failed"  # raised past its retries; can be retried or compensated
    CANCELLED = "cancelled"  # stopped at a step boundary on request
    NEEDS_ATTENTION = "needs_attention"  # an operator must decide: effect in doubt, or code diverged
    COMPENSATING = "compensating"  # undoing its effects in reverse order
    COMPENSATED = "compensated"  # every completed effect with a compensation was undone


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED})
LIVE_STATUSES = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.COMPENSATING})


def runnable_kinds(now) -> list[Q]:
    """The kinds of runnable run, each one range of an index on its status (``Run.Meta.indexes``).

    ``runnable`` is their union. A claim that wants the oldest few asks each kind for its oldest
    few: one condition ORed together is read whole and sorted, so a backlog of pending runs made
    every claim slower (SQLite: 0.4 ms at 100 pending, 6.6 ms at 10,000)."""
    return [
        Q(status=RunStatus.PENDING, paused=False),
        Q(status=RunStatus.COMPENSATING, paused=False, lease_owner=""),
        Q(status=RunStatus.SUSPENDED, paused=False, wake_at__lte=now),
        # A dead worker's run; a paused one waits for unpause (it holds no worker meanwhile).
        Q(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], paused=False, lease_expires_at__lt=now),
    ]


# The condition of the run_subject index. SQLite uses a partial index only for a query that states its
# condition, so a lookup by subject goes through subject_is, which adds it.
HAS_SUBJECT = ~Q(subject="")


def subject_is(subject: str) -> Q:
    """Runs linked to ``subject``, found through run_subject on both databases."""
    return Q(subject=subject) & HAS_SUBJECT


class RunQuerySet(models.QuerySet):
    def runnable(self, now=None):
        """Runs a worker may claim now: pending, due timers, and runs whose worker died (expired lease)."""
        kinds = runnable_kinds(now or timezone.now())
        condition = kinds[0]
        for kind in kinds[1:]:
            condition |= kind
        return self.filter(condition)

    def stale(self, now=None):
        """Runs whose lease expired: their worker is dead or paused past its TTL."""
        now = now or timezone.now()
        return self.filter(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], lease_expires_at__lt=now)

    def live(self):
        return self.filter(status__in=LIVE_STATUSES)

    def waiting_for_approval(self):
        return self.filter(status=RunStatus.SUSPENDED, waiting_for__kind="approval")


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=200)  # found through run_agent_recent, which leads with it
    harness = models.ForeignKey(
        "journal.Harness", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    version = models.CharField(max_length=64, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)

    input = models.JSONField(default=dict)  # {"args": [...], "kwargs": {...}}
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_type = models.CharField(max_length=200, blank=True)
    attention_reason = models.TextField(blank=True)

    durability = models.CharField(max_length=8, default="sync")
    checkpoint_policy = models.CharField(max_length=12, default="selective")

    # Lease and fencing: each claim bumps epoch; every journal write checks it.
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    epoch = models.PositiveBigIntegerField(default=0)

    # Suspension: what it waits for and when it must wake regardless.
    wake_at = models.DateTimeField(null=True, blank=True)
    waiting_for = models.JSONField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    paused_by = models.CharField(max_length=150, blank=True)  # who paused it (recorded when a worker lets go)
    pause_reason = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    cancel_reason = models.TextField(blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True)

    # Lineage: a child run started by ctx.child(), a fork made from a step of another run.
    # These three are empty on most runs: each is found through a partial index that holds only the runs
    # that have one (Meta), not the full index a foreign key gets by default (migration 0010 says why).
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children",
                               db_index=False)
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks",
                                    db_index=False)
    fork_step = models.PositiveIntegerField(null=True, blank=True)
    # A fan-out's children share a group (parent id and step) and its limit: claims keep at most
    # ``concurrency_limit`` of them running, and the parent wakes once, when the last one ends.
    concurrency_key = models.CharField(max_length=100, blank=True, default="")
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)

    # Progress and cost, summed as the run goes so lists need no aggregation.
    steps = models.PositiveIntegerField(default=0)  # journaled positions so far
    progress = models.JSONField(null=True, blank=True)  # {"done": n, "total": m, "label": "..."}
    tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    attempts = models.PositiveIntegerField(default=0)  # times a worker claimed it
    # Search summaries, written by the run state's owner in the UPDATE that moves the run: the step it
    # failed at (its dotted name; cleared when it completes), the time spent suspended (summed when a
    # suspension ends) and when the current suspension began.
    failed_step = models.CharField(max_length=200, blank=True, default="")
    waited = models.DurationField(default=timedelta(0))
    suspended_at = models.DateTimeField(null=True, blank=True)

    created_by = models.CharField(max_length=150, blank=True)
    # Whose data the run holds (a customer, a user): set at start or by ``ctx.set_subject``; what
    # ``journal.erase(subject=...)`` finds. Blank once erased (the Erasure keeps its hash).
    subject = models.CharField(max_length=200, blank=True, default="")  # run_subject holds the runs that have one
    erasure = models.ForeignKey("journal.Erasure", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="erased_runs", db_index=False)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="run_recent"),
            models.Index(fields=["status", "-created_at"], name="run_status_recent"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_recent"),
            models.Index(
                fields=["created_at"], name="run_pending", condition=Q(status=RunStatus.PENDING)
            ),
            models.Index(fields=["wake_at"], name="run_wake", condition=Q(status=RunStatus.SUSPENDED)),
            models.Index(
                fields=["lease_expires_at"],
                name="run_leased",
                condition=Q(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING]),
            ),
            models.Index(fields=["cost"], name="run_cost"),
            models.Index(fields=["tokens"], name="run_tokens"),
            models.Index(fields=["waited"], name="run_waited"),
            models.Index(fields=["parent"], name="run_parent", condition=Q(parent__isnull=False)),
            models.Index(fields=["forked_from"], name="run_forked_from", condition=Q(forked_from__isnull=False)),
            models.Index(fields=["erasure"], name="run_erasure", condition=Q(erasure__isnull=False)),
            models.Index(fields=["subject"], name="run_subject", condition=HAS_SUBJECT),
            models.Index(fields=["concurrency_key"], name="run_group_open",
                         condition=Q(status__in=[RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED,
                                                 RunStatus.NEEDS_ATTENTION, RunStatus.COMPENSATING])
                         & ~Q(concurrency_key="")),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(durability__in=["sync", "async", "exit"]), name="run_durability_valid"
            ),
            models.CheckConstraint(
                condition=Q(checkpoint_policy__in=["every", "selective", "manual"]), name="run_checkpoint_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.id} ({self.status})"

    @property
    def run_id(self) -> str:
        return str(self.id)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def is_erased(self) -> bool:
        return self.erasure_id is not None

    @property
    def duration(self):
        if not self.started_at:
            return None
        return (self.finished_at or timezone.now()) - self.started_at


def lease_seconds() -> int:
    return int(getattr(settings, "DURABLE_LEASE_SECONDS", 30))
