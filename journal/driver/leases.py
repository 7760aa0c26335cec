"""Leases: who may advance a run, for how long, and the fencing epoch that proves it.

A claim bumps ``Run.epoch``. On PostgreSQL candidates are locked with FOR UPDATE SKIP LOCKED so
racing workers never block or double-claim; on SQLite the claim is an atomic conditional
UPDATE whose row count says whether this worker won. An expired lease makes a run claimable
again: detection and recovery are the same query, so no human has to notice a dead worker.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from journal.driver.executor import Claim
from journal.engine import registry
from journal.models import Run, RunStatus
from journal.models.run import lease_seconds, runnable_kinds
from journal.store import faults, frozen, prepared, runstate


def _take(row: dict, worker_id: str, ttl: int, **filters) -> bool:
    """The claim's move (through the run state's owner): running, or still compensating, under a new epoch.

    Stamped with the time of the move itself, after the reads that decided it: a run's started_at is
    then never earlier than the end of the run whose slot it took (a fan-out's limit, as measured)."""
    target = RunStatus.COMPENSATING if row["status"] == RunStatus.COMPENSATING else RunStatus.RUNNING
    return runstate.move(row["id"], target, cause=runstate.Cause.CLAIM, sources=(row["status"],), filters=filters,
                         **_claim_fields(worker_id, row, timezone.now(), ttl))


def _claim_fields(worker_id: str, row: dict, now, ttl: int) -> dict:
    return {
        "lease_owner": worker_id,
        "lease_expires_at": now + timedelta(seconds=ttl),
        "epoch": row["epoch"] + 1,
        "attempts": row["attempts"] + 1,
        "started_at": row["started_at"] or now,
        "wake_at": None,
    }


def _over_limit(candidates: list[dict]) -> set[str]:
    """Agents at their max_concurrency: their runs wait, whatever the worker's free slots."""
    limited = {name: d.max_concurrency for name, d in registry.workflows().items() if d.max_concurrency}
    agents = {row["agent"] for row in candidates} & set(limited)
    if not agents:
        return set()
    running = dict(
        Run.objects.filter(agent__in=agents, status=RunStatus.RUNNING)
        .values_list("agent").annotate(n=Count("id")).values_list("agent", "n")
    )
    return {a for a in agents if running.get(a, 0) >= limited[a]}


def _room():
    """Not a run that would start another child of a fan-out group already running as many children
    as its limit allows.

    Only a pending child or a waking one would: a running child whose worker died already counts
    among its group's running ones (before, a group whose every running child had lost its worker
    counted as full, and none of them was ever recovered), and a compensating one never counts. A
    subquery, so the claim stays one statement; asked only of a run that has a group, so a claim
    among runs of none never counts the running ones (SQLite evaluates it on first use)."""
    return (Q(concurrency_key="") | Q(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING])
            | ~Q(concurrency_key__in=_full_groups()))


def _full_groups():
    """Fan-out groups already running as many children as their limit allows."""
    return (
        Run.objects.filter(status=RunStatus.RUNNING).exclude(concurrency_key="")
        .values("concurrency_key", "concurrency_limit").annotate(n=Count("id"))
        .filter(n__gte=F("concurrency_limit")).values("concurrency_key")
    )


class _GroupRoom:
    """How many more children of each fan-out group this claim may start (the rest wait their turn)."""

    def __init__(self, rows: list[dict]):
        keys = {row["concurrency_key"] for row in rows if row["concurrency_key"]}
        running = dict(
            Run.objects.filter(concurrency_key__in=keys, status=RunStatus.RUNNING).values_list("concurrency_key")
            .annotate(n=Count("id")).values_list("concurrency_key", "n")
        ) if keys else {}
        self.room = {row["concurrency_key"]: (row["concurrency_limit"] or 1) - running.get(row["concurrency_key"], 0)
                     for row in rows if row["concurrency_key"]}

    def take(self, row: dict) -> bool:
        key = row["concurrency_key"]
        if not key or row["status"] != RunStatus.PENDING:  # a recovered child already held its slot
            return True
        if self.room.get(key, 0) <= 0:
            return False
        self.room[key] -= 1
        return True


def _not_lapsed_by(owner: str, grace) -> Q:
    """Not a run whose lease ``owner`` let lapse since ``grace`` (see ``_candidates``)."""
    return ~Q(lease_owner=owner, status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], lease_expires_at__gte=grace)


def _candidates(variant: tuple[bool, int, bool], *, now, run_id, owner, grace):
    """The runs a claim may take, oldest first: ``variant`` is (one run only, how many, lock them).

    Not a run whose lease ``owner`` (the claiming worker) let lapse less than a lease ago: that
    worker is most likely still driving it, its heartbeat late under load, and claiming it from
    itself would fence out its own driving thread and run the step in flight a second time. A
    run its owner really dropped (or gave back, see ``give_back``) is its to claim a lease later;
    any other worker may claim it at once."""
    one, n, lock = variant
    qs = Run.objects.runnable(now).filter(_not_lapsed_by(owner, grace))
    if one:
        qs = qs.filter(id=run_id)
    # In SQL, so a saturated fan-out's waiting children cannot crowd other runs out of the window.
    qs = qs.filter(_room()).order_by("created_at")
    if lock:
        qs = qs.select_for_update(skip_locked=True)
    return qs.values(*_CLAIM_FIELDS)[:n]


_CLAIM_FIELDS = ("id", "status", "epoch", "attempts", "started_at", "lease_owner", "agent", "concurrency_key",
                 "concurrency_limit")
# Compiled once per limit: the claim runs on every poll of every worker (frozen.py says what it saves).
# Not a prepared statement: its status values choose the partial indexes (run_pending, run_wake,
# run_leased) that a generic plan could not use once a table holds many finished runs.
_CANDIDATES = frozen.FrozenQuery(Run, _CLAIM_FIELDS, _candidates, prepare=False, now=frozen.SENTINEL_TIME,
                                 run_id=frozen.SENTINEL_UUID, owner=frozen.SENTINEL_TEXT,
                                 grace=frozen.SENTINEL_EARLIER)


def _of_kind(variant: tuple[int, int], *, now=None, owner=None, grace=None):
    """The oldest ``n`` runs of one kind of runnable run (``variant`` is (kind, n)): one index range,
    read in creation order, ``LIMIT n``. ``_oldest`` merges the kinds; what ``_candidates`` leaves
    out, this leaves out."""
    kind, n = variant
    qs = Run.objects.filter(runnable_kinds(now)[kind])
    if kind == _LAPSED:
        qs = qs.filter(_not_lapsed_by(owner, grace))
    return qs.filter(_room()).order_by("created_at").values(*_KIND_FIELDS)[:n]


_LAPSED = 3  # runnable_kinds: a worker's lapsed lease, the one kind a worker must not take from itself
_KIND_VALUES = ((), (), ("now",), ("now", "owner", "grace"))  # what each kind's SQL reads
_KIND_FIELDS = (*_CLAIM_FIELDS, "created_at", "updated_at")  # the merge orders by the first; the sweep reads both
_OF_KIND = frozen.FrozenQuery(Run, _KIND_FIELDS, _of_kind, literals=True, now=frozen.SENTINEL_TIME,
                              owner=frozen.SENTINEL_TEXT, grace=frozen.SENTINEL_EARLIER)
_OLDEST_SQL: dict[tuple[str, int], str] = {}
# SQLite, which keeps no statistics unless told to ANALYZE, reads due timers and lapsed leases along
# the status index: every suspended run (10,000 waiting for approvals: 1.4-1.9 ms a claim) to find
# the few due. Named here, their partial indexes (``Run.Meta.indexes``) are read instead; SQLite
# refuses the statement rather than ignore an index that no longer fits it.
_KIND_INDEX = (None, None, "run_wake", "run_leased")


def _indexed(select: str, table: str, index: str | None) -> str:
    if index is None or connection.vendor != "sqlite":
        return select
    return select.replace(f"FROM {table} ", f"FROM {table} INDEXED BY {connection.ops.quote_name(index)} ", 1)


def _oldest(n: int, values: dict) -> list[dict]:
    """The ``n`` oldest runnable runs, at a cost that does not grow with the backlog (SQLite's claim,
    and beat's sweep on either database).

    Each kind's oldest ``n``, then the oldest ``n`` of those, in one statement: ``_candidates``'
    one ORed condition made SQLite read every pending run and sort them (a claim took 6.6 ms
    at 10,000 pending; now 0.4 ms, as at 100). UNION, not UNION ALL: a run of two kinds (compensating,
    unowned and lapsed) comes once."""
    statements = [_OF_KIND.statement((kind, n), **{name: values[name] for name in names})
                  for kind, names in enumerate(_KIND_VALUES)]
    key = (connection.vendor, n)
    sql = _OLDEST_SQL.get(key)
    if sql is None:
        table = connection.ops.quote_name(Run._meta.db_table)
        branches = " UNION ".join(
            f"SELECT * FROM ({_indexed(select, table, _KIND_INDEX[k])}) AS kind{k}"
            for k, (select, _) in enumerate(statements))
        sql = _OLDEST_SQL[key] = f'SELECT * FROM ({branches}) AS runnable ORDER BY "created_at" LIMIT {n}'
    with prepared.cursor(False) as cursor:
        cursor.execute(sql, [param for _, params in statements for param in params])
        return _OF_KIND.convert(cursor.fetchall())


def oldest_runnable(n: int, now) -> list[dict]:
    """The ``n`` oldest runs a worker could claim now, whoever it is (beat's sweep rings for them): what
    a claim reads, along the same indexes, so its cost does not grow with the backlog either."""
    return _oldest(n, {"now": now, "owner": "", "grace": now})


def claim(worker_id: str, limit: int = 1, *, run_id=None, ttl: int | None = None) -> list[Claim]:
    """Claim up to ``limit`` runnable runs (or the one ``run_id``) for ``worker_id``."""
    if limit <= 0:
        return []
    ttl = ttl or lease_seconds()
    faults.inject("claim", worker=worker_id)
    now = timezone.now()
    one = run_id is not None
    values = {"now": now, "owner": worker_id, "grace": now - timedelta(seconds=ttl),
              **({"run_id": run_id} if one else {})}
    claims: list[Claim] = []
    if connection.vendor == "postgresql":
        if (one or limit == 1) and not _agent_limits():
            return _claim_one(worker_id, ttl, now, values)
        with transaction.atomic():
            rows = _CANDIDATES.rows((one, limit * 2, True), **values)
            for row in _eligible(rows):
                if len(claims) >= limit:
                    break
                _take(row, worker_id, ttl)  # the row is locked: the move cannot miss
                claims.append(_to_claim(row, now))
        return claims
    rows = _CANDIDATES.rows((one, limit * 4, False), **values) if one else _oldest(limit * 4, values)
    # SQLite: the moves need not wait for the disk (an fsync each); the run's next durable record syncs
    # them, before anything outside the database can act on the claim (sqlite_backend.synced_later).
    with getattr(connection, "synced_later", nullcontext)():
        for row in _eligible(rows):
            if len(claims) >= limit:
                break
            if _take(row, worker_id, ttl, epoch=row["epoch"], lease_owner=row["lease_owner"]):
                claims.append(_to_claim(row, now))
    return claims


def _agent_limits() -> bool:
    return any(defn.max_concurrency for defn in registry.workflows().values())


def _claim_one(worker_id: str, ttl: int, now, values: dict) -> list[Claim]:
    """PostgreSQL, one run: the candidate locked and moved in one statement (``runstate.claim_statement``).

    What ``_eligible`` would decide needs no Python here: no agent has a limit, a pending or waking
    child the candidate query lets through belongs to a group below its limit, so it has room for
    one more, and a running child it recovers already holds its place."""
    candidates = _CANDIDATES.statement(("run_id" in values, 1, True), **values)
    moved = timezone.now()  # stamped after nothing was read, as _take stamps it after the reads
    sql, params = runstate.claim_statement(candidates, lease_owner=worker_id,
                                           lease_expires_at=moved + timedelta(seconds=ttl), now=moved)
    with prepared.cursor(False) as cursor:  # planned for its values: they pick the partial indexes
        cursor.execute(sql, params)
        rows = _CANDIDATES.convert(cursor.fetchall())
    return [_to_claim(row, now) for row in rows]


def _eligible(rows: list[dict]):
    """The candidates a claim may take, in order: not of an agent at its limit, not past a fan-out's."""
    blocked = _over_limit(rows)
    room = _GroupRoom(rows)
    for row in rows:
        if row["agent"] not in blocked and room.take(row):
            yield row


def _to_claim(row: dict, now) -> Claim:
    recovered = row["lease_owner"] if row["status"] in (RunStatus.RUNNING, RunStatus.COMPENSATING) else ""
    return Claim(run_id=row["id"], epoch=row["epoch"] + 1, recovered_from=recovered)


def renew(worker_id: str, held: dict, *, ttl: int | None = None) -> dict:
    """Extend the leases of ``held`` ({run_id: epoch}); returns {run_id: flags} for runs still held.

    Flags carry what operators asked for (cancel, pause) so the driving thread can act at its
    next step boundary. A run missing from the result was lost (another worker took it).
    """
    if not held:
        return {}
    ttl = ttl or lease_seconds()
    faults.inject("renew", worker=worker_id)
    now = timezone.now()
    Run.objects.filter(id__in=list(held), lease_owner=worker_id).update(lease_expires_at=now + timedelta(seconds=ttl))
    rows = Run.objects.filter(id__in=list(held), lease_owner=worker_id).values_list(
        "id", "epoch", "cancel_requested", "cancel_reason", "paused")
    return {
        rid: {"cancel": cancel, "reason": reason, "paused": paused}
        for rid, epoch, cancel, reason, paused in rows
        if held.get(rid) == epoch
    }


def expire_worker(worker_id: str) -> int:
    """Make a stopped worker's leases claimable at once (clean shutdown that could not finish)."""
    return Run.objects.filter(lease_owner=worker_id, status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING]).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))


def give_back(worker_id: str, held: dict, *, ttl: int | None = None) -> int:
    """Make runs this worker gave up during a database outage claimable at once ({run_id: epoch}),
    by itself too: expired more than a lease (``ttl``) ago, as ``claim`` asks of its own runs.

    Fenced like every write of a claim: a run another worker claimed meanwhile (a newer epoch) is left
    alone, and the run keeps its status, so the next claim recovers it from its journal.
    """
    now = timezone.now() - timedelta(seconds=(ttl or lease_seconds()) + 1)
    returned = 0
    for run_id, epoch in held.items():
        returned += Run.objects.filter(id=run_id, epoch=epoch, lease_owner=worker_id,
                                       status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING]).update(
            lease_expires_at=now)
    return returned
