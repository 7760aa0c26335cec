"""Session: the append-only log of everything that happened in a run.

Nothing deletes a SessionEvent except retention, and nothing updates one except erasure, which
may rewrite the ``payload`` column and nothing else (seq, kind, position, step name, actor and
time are the skeleton that survives). The ORM refuses anything else here; on PostgreSQL a trigger
refuses it too (migrations 0002 and 0006), unless retention sets ``durable.retention = 'on'`` (a
DELETE) or erasure sets ``durable.erasure = 'on'`` (an UPDATE of the payload only) for its
transaction.
"""

import contextlib
import contextvars

from django.db import connection, models
from django.db.models import Q
from django.utils import timezone

from journal.models.keys import AppendKey


class EventKind(models.TextChoices):
    RUN_STARTED = "run_started"
    RUN_CLAIMED = "run_claimed"  # a worker took the lease (attempt n)
    RUN_RECOVERED = "run_recovered"  # taken over from a worker whose lease expired
    STEP_COMPLETED = "step_completed"  # the recorded result at a position: what replay returns
    STEP_FAILED = "step_failed"  # one attempt failed (retries may follow)
    EFFECT_STARTED = "effect_started"  # intent committed before an effect executes
    EFFECT_IN_DOUBT = "effect_in_doubt"  # found started with no result after a crash
    SIGNAL_RECEIVED = "signal_received"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    TIMER_STARTED = "timer_started"
    TIMER_FIRED = "timer_fired"
    WAIT_STARTED = "wait_started"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    CHILD_STARTED = "child_started"
    SANDBOX_COMMAND = "sandbox_command"
    CHECKPOINT = "checkpoint"
    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"
    NONDETERMINISM = "nondeterminism"
    NEEDS_ATTENTION = "needs_attention"
    OPERATOR_ACTION = "operator_action"
    SUBJECT_SET = "subject_set"  # the workflow linked the run to a subject (ctx.set_subject)
    CANCEL_REQUESTED = "cancel_requested"
    COMPENSATION_STARTED = "compensation_started"
    COMPENSATED = "compensated"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    LOG = "log"


_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar("journal_retention", default=False)
_erasing: contextvars.ContextVar[bool] = contextvars.ContextVar("journal_erasure", default=False)
ERASABLE = frozenset({"payload"})  # the only column erasure may rewrite


def retention_allowed() -> bool:
    return _allowed.get()


@contextlib.contextmanager
def allow_deletes():
    """Let this block delete session events (PostgreSQL: also tells the trigger, for this transaction)."""
    token = _allowed.set(True)
    try:
        if connection.vendor == "postgresql" and connection.in_atomic_block:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL durable.retention = 'on'")
        yield
    finally:
        _allowed.reset(token)


def erasure_allowed() -> bool:
    return _erasing.get()


@contextlib.contextmanager
def allow_erasure():
    """Let this block rewrite session events' payloads (and nothing else); call inside a transaction.

    PostgreSQL: also tells the trigger, for this transaction only (``SET LOCAL``).
    """
    if not connection.in_atomic_block:
        raise AppendOnlyError("erasure rewrites the session log only inside a transaction")
    token = _erasing.set(True)
    try:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL durable.erasure = 'on'")
        yield
    finally:
        _erasing.reset(token)


def _check_erasure(fields) -> None:
    if not erasure_allowed():
        raise AppendOnlyError("the session log is append-only: SessionEvent rows are never updated "
                              "(only erasure rewrites a payload)")
    if not fields or set(fields) - ERASABLE:
        raise AppendOnlyError(f"erasure rewrites only a session event's payload, not "
                              f"{', '.join(sorted(set(fields or ()) - ERASABLE)) or 'every column'}")


class AppendOnlyError(Exception):
    """Raised when code tries to update or delete a session event outside erasure and retention."""


class SessionEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        _check_erasure(kwargs)  # bulk_update arrives here too, with its CASE per field
        return super().update(**kwargs)

    def delete(self):
        if not retention_allowed():
            raise AppendOnlyError("the session log is append-only: only retention deletes SessionEvent rows")
        return super().delete()

    def steps(self):
        """Events that occupy a step position: what replay, the stepper and fork address."""
        return self.filter(position__isnull=False, kind=EventKind.STEP_COMPLETED)


class SessionEvent(models.Model):
    id = AppendKey(primary_key=True)
    # No index of its own: the unique (run, seq) constraint leads with run_id. One index fewer
    # to maintain on the hottest insert of the engine. No foreign-key check on PostgreSQL either
    # (migration 0009): every append is fenced by its run's row, read under a share lock in the same
    # statement, which proves the run exists and keeps it from being deleted until the append commits;
    # the check re-read that row for every record (~15 µs of the server's CPU a step). A trigger on
    # journal_run refuses deleting a run whose events remain, as the constraint did. SQLite keeps the
    # key (migration 0011 rebuilds the table with it).
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="events", db_index=False,
                            db_constraint=False)
    seq = models.PositiveIntegerField()  # per-run event number, 1-based, dense
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    position = models.PositiveIntegerField(null=True, blank=True)  # 1-based step position, for step events
    step_name = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict)
    actor = models.CharField(max_length=150, blank=True)  # who caused it: a user, a token, a worker
    created_at = models.DateTimeField(default=timezone.now)

    objects = SessionEventQuerySet.as_manager()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_run_seq")]
        indexes = [
            models.Index(
                fields=["run", "position"],
                name="event_run_step",
                condition=Q(position__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind} {self.step_name}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            _check_erasure(kwargs.get("update_fields"))
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if not retention_allowed():
            raise AppendOnlyError("the session log is append-only: only retention deletes SessionEvent rows")
        return super().delete(*args, **kwargs)
