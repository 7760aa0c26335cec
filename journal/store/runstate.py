"""The one owner of a run's status: the table of allowed moves, and the only code that writes them.

Every change of ``Run.status`` in the engine goes through :func:`move` (or :func:`wake`, its
common case), or, for PostgreSQL's claim of one run, :func:`claim_statement`, which writes the
claim's moves of the same table in one statement. A move names its cause; a move the table does
not allow is refused before any SQL runs (a programming error, ``RefusedMove``), and a move whose
run is no longer in the expected status changes nothing and returns ``False``: the conditional
``UPDATE … WHERE status IN (…)`` is the check, so two actors racing for one run cannot both win.

The session event of a move is written in the same transaction: by :func:`move` itself for a run
no worker holds (``event=``), or by the fenced journal writer for the run a worker drives, which
calls :func:`move` from inside the transaction that appends the event (``extra=`` of
``JournalWriter.record``).

The status sets that other modules ask about (``STOPPED``, ``HELD``, ``PAUSABLE`` …) are defined
here once, next to the table they summarise.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.db.models import Case, DurationField, ExpressionWrapper, F, Max, Value, When
from django.utils import timezone

from journal.models import LIVE_STATUSES, TERMINAL_STATUSES, Run, RunStatus, SessionEvent
from journal.store import frozen
from journal.store.errors import LeaseLost, RunStateError

S = RunStatus


class Cause(enum.StrEnum):
    """Who or what moves a run."""

    CLAIM = "claim"  # a worker takes the lease (leases.claim)
    SETTLE = "settle"  # the worker driving the run records how the drive ended
    WAKE = "wake"  # what a suspended run waited for happened: signal, approval, child, decision
    OPERATOR = "operator"  # a person (or the API) acting on the run: cancel, retry, resume, compensate
    SAGA = "saga"  # compensation begins after a failure or cancellation


# (from, to) -> the causes that may make that move. Anything else is refused.
MOVES: dict[tuple[str, str], frozenset[Cause]] = {
    (S.PENDING, S.RUNNING): frozenset({Cause.CLAIM}),
    (S.SUSPENDED, S.RUNNING): frozenset({Cause.CLAIM}),  # a due timer
    (S.RUNNING, S.RUNNING): frozenset({Cause.CLAIM}),  # taking over from a dead worker
    (S.COMPENSATING, S.COMPENSATING): frozenset({Cause.CLAIM, Cause.SETTLE}),  # claimed, or given back
    (S.RUNNING, S.COMPLETED): frozenset({Cause.SETTLE}),
    (S.RUNNING, S.FAILED): frozenset({Cause.SETTLE}),
    (S.RUNNING, S.CANCELLED): frozenset({Cause.SETTLE}),
    (S.RUNNING, S.SUSPENDED): frozenset({Cause.SETTLE}),
    (S.RUNNING, S.NEEDS_ATTENTION): frozenset({Cause.SETTLE}),
    (S.RUNNING, S.PENDING): frozenset({Cause.SETTLE, Cause.OPERATOR}),  # released; paused after its worker died
    (S.SUSPENDED, S.PENDING): frozenset({Cause.WAKE}),
    (S.PENDING, S.CANCELLED): frozenset({Cause.OPERATOR}),
    (S.SUSPENDED, S.CANCELLED): frozenset({Cause.OPERATOR}),
    (S.NEEDS_ATTENTION, S.CANCELLED): frozenset({Cause.OPERATOR}),
    (S.FAILED, S.PENDING): frozenset({Cause.OPERATOR}),  # retry
    (S.NEEDS_ATTENTION, S.PENDING): frozenset({Cause.OPERATOR}),  # retry, resume, resolve an effect
    (S.RUNNING, S.COMPENSATING): frozenset({Cause.SAGA}),  # the run fails or is cancelled past effects
    (S.FAILED, S.COMPENSATING): frozenset({Cause.OPERATOR, Cause.SAGA}),
    (S.CANCELLED, S.COMPENSATING): frozenset({Cause.OPERATOR, Cause.SAGA}),
    (S.NEEDS_ATTENTION, S.COMPENSATING): frozenset({Cause.OPERATOR}),
    (S.COMPENSATING, S.COMPENSATED): frozenset({Cause.SETTLE}),
    (S.COMPENSATING, S.NEEDS_ATTENTION): frozenset({Cause.SETTLE}),
    (S.COMPENSATING, S.FAILED): frozenset({Cause.SETTLE}),  # the saga itself broke (not a compensation)
    (S.COMPENSATING, S.PENDING): frozenset({Cause.SETTLE}),  # released before the saga began
}

TERMINAL = TERMINAL_STATUSES  # defined beside the model, whose querysets need them
LIVE = LIVE_STATUSES
STOPPED = TERMINAL | {S.NEEDS_ATTENTION}  # journal.wait returns on these
HELD = frozenset({S.PENDING, S.RUNNING, S.SUSPENDED, S.COMPENSATING})  # a pause can hold these
IDLE = frozenset({S.PENDING, S.SUSPENDED, S.NEEDS_ATTENTION})  # no worker holds them: cancelled at once
RETRYABLE = frozenset({S.FAILED, S.NEEDS_ATTENTION, S.CANCELLED})
COMPENSABLE = frozenset({S.FAILED, S.CANCELLED, S.NEEDS_ATTENTION})


class RefusedMove(RunStateError):
    """A move the table does not allow was asked for; nothing was written."""


def allowed(source: str, target: str, cause: Cause) -> bool:
    return cause in MOVES.get((source, target), frozenset())


def check(sources: Iterable[str], target: str, cause: Cause) -> tuple[str, ...]:
    """The sources, if each may move to ``target`` for ``cause``; else RefusedMove naming the first that may not."""
    sources = tuple(sources)
    for source in sources:
        if not allowed(source, target, cause):
            raise RefusedMove(f"a run cannot go from {source} to {target} by {cause}")
    return sources


def lock_for_wake(run_id) -> None:
    """Lock the run's row before deciding whether to wake it (call inside the waking transaction).

    Without it, on PostgreSQL (READ COMMITTED) a wake-up can be lost: the waker's conditional
    UPDATE sees the run still running and matches nothing, while the run's suspension
    transaction checks the inbox (or the child, or the approval) before the waker commits.
    Holding the row lock orders the two: either the suspension commits first and the waker
    sees "suspended", or the waker commits first and the suspension's check sees its row.
    SQLite's IMMEDIATE transactions already serialize writers.
    """
    if connection.vendor == "postgresql":
        list(Run.objects.select_for_update().filter(id=run_id).values_list("id", flat=True))


def append_event(run_id, kind: str, payload: dict, *, actor: str = "", position: int | None = None,
                 step_name: str = "") -> SessionEvent:
    """Append to the session of a run no worker holds. Call inside a transaction that already
    changed (and so locked) the run row, so no claim can interleave."""
    last = SessionEvent.objects.filter(run_id=run_id).aggregate(m=Max("seq"))["m"] or 0
    return SessionEvent.objects.create(run_id=run_id, seq=last + 1, kind=kind, payload=payload, actor=actor,
                                       position=position, step_name=step_name)


def move(run_id, target: str, *, cause: Cause, sources: Iterable[str], at_epoch: int | None = None,
         event: str | None = None, payload: dict | None = None, actor: str = "", filters: dict | None = None,
         **fields: Any) -> bool:
    """Move the run to ``target`` if it is in one of ``sources`` (and at ``at_epoch``, when fenced).

    Returns whether it moved. ``event`` appends that session event in the same transaction (for
    a run no worker holds; the caller holds a transaction). ``filters`` narrow the match further
    (what a wake-up waits for); ``fields`` are written with the status.
    """
    sources = check(sources, target, cause)
    where = {"id": run_id, "status__in": sources, **(filters or {})}
    if at_epoch is not None:
        where["epoch"] = at_epoch
    moved = frozen.update(Run.objects, where, {"status": target, **_suspension_fields(target, sources, fields)}) == 1
    if moved and event is not None:
        append_event(run_id, event, payload or {}, actor=actor)
    return moved


# The claim's moves, by the status a runnable run is in (``Run.objects.runnable``): compensating stays
# compensating under the new lease, every other goes running.
CLAIMED = {S.PENDING: S.RUNNING, S.SUSPENDED: S.RUNNING, S.RUNNING: S.RUNNING, S.COMPENSATING: S.COMPENSATING}


_CLAIM_SQL: dict[str, str] = {}  # by the candidate query's SQL: built once, as frozen builds its own


def _claim_sql(select: str) -> str:
    for source, target in CLAIMED.items():
        check((source,), target, Cause.CLAIM)
    col = {name: connection.ops.quote_name(Run._meta.get_field(name).column) for name in (
        "id", "status", "lease_owner", "lease_expires_at", "epoch", "attempts", "started_at", "wake_at",
        "suspended_at", "waited")}
    status = "CASE c.{s} " + " ".join(f"WHEN '{source}' THEN '{target}'" for source, target in CLAIMED.items()) + " END"
    return (
        f"WITH c AS ({select}) UPDATE {connection.ops.quote_name(Run._meta.db_table)} AS r SET "
        f"{col['status']} = {status.format(s=col['status'])}, {col['lease_owner']} = %s, "
        f"{col['lease_expires_at']} = %s, {col['epoch']} = c.{col['epoch']} + 1, "
        f"{col['attempts']} = c.{col['attempts']} + 1, {col['started_at']} = COALESCE(c.{col['started_at']}, %s), "
        f"{col['wake_at']} = NULL, "
        f"{col['suspended_at']} = CASE WHEN c.{col['status']} = '{S.SUSPENDED}' THEN NULL "
        f"ELSE r.{col['suspended_at']} END, "
        f"{col['waited']} = CASE WHEN c.{col['status']} = '{S.SUSPENDED}' AND r.{col['suspended_at']} IS NOT NULL "
        f"THEN r.{col['waited']} + (%s - r.{col['suspended_at']}) ELSE r.{col['waited']} END "
        f"FROM c WHERE r.{col['id']} = c.{col['id']} RETURNING c.*"
    )


def claim_statement(candidates: tuple[str, list], *, lease_owner: str, lease_expires_at, now) -> tuple[str, list]:
    """PostgreSQL: the claim's move of the run that ``candidates`` selects (locked FOR UPDATE SKIP
    LOCKED, at most one) as one statement, which returns that run's row as it was before the move.

    It writes what :func:`move` with ``Cause.CLAIM`` writes from each source in ``CLAIMED``: the
    new status, the lease, the epoch and attempts one up, ``started_at`` kept or stamped now, the
    timer cleared, and a due timer's wait added to ``waited`` as ``_suspension_fields`` adds it.
    One round trip where the select-then-update transaction took four (BEGIN, SELECT, UPDATE, COMMIT).
    """
    select, params = candidates
    sql = _CLAIM_SQL.get(select)
    if sql is None:
        sql = _CLAIM_SQL[select] = _claim_sql(select)
    return sql, [*params, lease_owner, lease_expires_at, now, now]


class FencedMove:
    """The driving worker's move, fenced by its claim's epoch, as a value the journal writer runs.

    Called inside the writer's transaction it is one UPDATE (LeaseLost if another worker took the
    run). On PostgreSQL the writer can instead fold ``statement()`` into the journal write itself
    (``UPDATE … RETURNING`` in a ``WITH``, the events inserted only if it matched): a run's last
    write is then one statement and one round trip, not BEGIN, INSERT, UPDATE and COMMIT.
    """

    __slots__ = ("run_id", "where", "values")

    def __init__(self, run_id, epoch: int, target: str, *, cause: Cause, sources: Iterable[str], **fields: Any):
        sources = check(sources, target, cause)
        self.run_id = run_id
        self.where = {"id": run_id, "epoch": epoch, "status__in": sources}
        self.values = {"status": target, **_suspension_fields(target, sources, fields)}

    def __call__(self) -> None:
        if frozen.update(Run.objects, self.where, self.values) != 1:
            raise LeaseLost(f"run {self.run_id} was claimed by another worker")

    def statement(self) -> tuple[str, list] | None:
        """The UPDATE's SQL and parameters, or None when only the ORM can write it (an F expression)."""
        return frozen.update_statement(Run.objects, self.where, self.values)


def move_fenced(run_id, epoch: int, target: str, *, cause: Cause, sources: Iterable[str], **fields: Any) -> None:
    """The driving worker's move: fenced by its claim's epoch; LeaseLost if another worker took the run."""
    FencedMove(run_id, epoch, target, cause=cause, sources=sources, **fields)()


def _suspension_fields(target: str, sources: tuple[str, ...], fields: dict[str, Any]) -> dict[str, Any]:
    """The search summary of waiting, kept in the move's own UPDATE: a run that suspends notes when;
    a run that leaves ``suspended`` (woken, claimed by its timer, cancelled) adds the time it waited."""
    if target == S.SUSPENDED:
        return {**fields, "suspended_at": timezone.now()}
    if S.SUSPENDED not in sources:
        return fields
    now = Value(timezone.now())
    waited = ExpressionWrapper(now - F("suspended_at"), output_field=DurationField())
    return {**fields, "suspended_at": None, "waited": Case(
        When(status=S.SUSPENDED, suspended_at__isnull=False, then=F("waited") + waited),
        default=F("waited"), output_field=DurationField())}


def wake(run_id, *, sources: Iterable[str] = (S.SUSPENDED,), at_epoch: int | None = None,
         waiting_for: dict | None = None) -> bool:
    """A suspended run becomes runnable (its wait is over); ``waiting_for`` keys must match its wait."""
    filters = {f"waiting_for__{k}": v for k, v in (waiting_for or {}).items()}
    return move(run_id, S.PENDING, cause=Cause.WAKE, sources=sources, at_epoch=at_epoch, filters=filters,
                wake_at=None)


def released_fields(*, steps: int, progress: dict | None = None, tokens: int = 0, cost: float = 0.0) -> dict:
    """What every end of a drive writes besides the status: the lease let go, progress and cost summed."""
    fields: dict[str, Any] = {"lease_owner": "", "lease_expires_at": None, "steps": steps}
    if progress is not None:
        fields["progress"] = progress
    if tokens:
        fields["tokens"] = F("tokens") + tokens
        fields["cost"] = F("cost") + cost
    return fields
