"""The journal writer: durability modes and the fenced append.

One completed plain step in ``sync`` mode costs one INSERT ... SELECT ... WHERE EXISTS (the
fencing check: the run's epoch must still be ours) and one commit; no read-back. ``async``
hands entries to a background thread that writes them in batches; ``exit`` keeps them in
memory. Every mode is flushed by ``barrier()`` before an effect, a suspension or the end of
the run, so nothing durable ever depends on an entry that is not.

A write that fails because the database went away is retried with bounded backoff
(``journal.store.outage``); a write that does not commit takes no sequence number, so the session
log of a run is always 1..N without gaps.

Trace spans ride along in the same transaction when enough have accumulated or at a barrier:
the trace explains, the journal decides, so spans never cost a commit of their own.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction

from journal.models import EventKind, Run, SessionEvent
from journal.store import faults, groupcommit, outage, prepared, runstate
from journal.store.errors import DatabaseUnavailable, LeaseLost
from journal.store.serialization import COMPACT, storable_json, storable_text
from journal.store.summaries import record_step_names, step_keys

log = logging.getLogger(__name__)

SPAN_BATCH = 64
# A seam: what else wants the trace spans once they are written (journal.integrations.otel registers
# an OpenTelemetry exporter at start-up when OTEL_EXPORTER_OTLP_ENDPOINT is set).
SPAN_LISTENERS: list[Callable[[uuid.UUID, list[dict]], None]] = []
_COLS = "run_id, seq, kind, position, step_name, payload, actor, created_at"
_PG_ROW = "(%s::uuid, %s::integer, %s::varchar, %s::integer, %s::varchar, %s::jsonb, %s::varchar, %s::timestamptz)"
_SQLITE_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s)"


class Entry:
    __slots__ = ("seq", "kind", "position", "step_name", "payload", "actor", "created_at")

    def __init__(self, seq, kind, position, step_name, payload, actor, created_at):
        self.seq = seq
        self.kind = kind
        self.position = position
        self.step_name = step_name
        self.payload = payload
        self.actor = actor
        self.created_at = created_at


def _fenced_insert_sql(vendor: str, rows: int) -> str:
    row = _PG_ROW if vendor == "postgresql" else _SQLITE_ROW
    lock = " FOR SHARE" if vendor == "postgresql" else ""
    values = ", ".join([row] * rows)
    return (
        f"INSERT INTO journal_sessionevent ({_COLS}) SELECT * FROM (VALUES {values}) AS v "
        f"WHERE EXISTS (SELECT 1 FROM journal_run WHERE id = %s AND epoch = %s{lock})"
    )


_SQL_CACHE: dict[tuple[str, int], str] = {}


def _sqlite_datetime(value: datetime) -> str:
    """What Django stores for an aware datetime on SQLite (naive UTC text), without its generic checks."""
    if value.tzinfo is UTC:  # the text str() gives the naive value, with its "+00:00" cut off: half the cost
        return value.isoformat(" ")[:-6]
    return connection.ops.adapt_datetimefield_value(value)


def fenced_append(run_id: uuid.UUID, epoch: int, entries: list[Entry]) -> None:
    """Append entries iff the run's epoch is still ``epoch``; raise LeaseLost otherwise.

    On PostgreSQL the EXISTS takes a share lock on the run row, so a concurrent claim (which
    bumps the epoch) waits for this commit or makes this insert see the new epoch: a zombie
    can never slip a row in after the takeover.
    """
    if not entries:
        return
    conn = connections[DEFAULT_DB_ALIAS]  # the thread's connection, looked up once
    vendor = conn.vendor
    key = (vendor, len(entries))
    sql = _SQL_CACHE.get(key)
    if sql is None:
        sql = _SQL_CACHE[key] = _fenced_insert_sql(vendor, len(entries))
    pg = vendor == "postgresql"
    run_param: Any = run_id if pg else run_id.hex
    params: list[Any] = []
    for e in entries:
        created: Any = e.created_at if pg else _sqlite_datetime(e.created_at)
        params += [run_param, e.seq, e.kind, e.position, e.step_name, e.payload, e.actor, created]
    params += [run_param, epoch]
    if pg and len(entries) >= COPY_ROWS and conn.in_atomic_block:
        inserted = _copy_fenced(run_id, epoch, entries)
    else:
        inserted = prepared.execute(conn, sql, params)  # PostgreSQL: parsed and planned once per connection
    if inserted != len(entries):
        raise LeaseLost(f"run {run_id} was claimed by another worker (epoch {epoch} is stale)")


COPY_ROWS = 8  # PostgreSQL batches this large go in by COPY: binary rows, no SQL to quote and parse


def _copy_fenced(run_id: uuid.UUID, epoch: int, entries: list[Entry]) -> int:
    """The fence as its own locking read (the caller's transaction keeps the share lock until it
    commits, exactly as the one-statement form does), then the rows by COPY."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM journal_run WHERE id = %s AND epoch = %s FOR SHARE", [run_id, epoch])
        if cursor.fetchone() is None:
            return 0
        with cursor.cursor.copy(f"COPY journal_sessionevent ({_COLS}) FROM STDIN") as copy:
            for e in entries:
                copy.write_row((run_id, e.seq, e.kind, e.position, e.step_name, e.payload, e.actor, e.created_at))
    return len(entries)


class JournalWriter:
    """Per-run writer owned by the thread that drives the run."""

    def __init__(self, run_id: uuid.UUID | str, epoch: int, next_seq: int, mode: str = "sync"):
        self.run_id = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        self.epoch = epoch
        self.next_seq = next_seq
        self.mode = mode
        self._pending: list[Entry] = []  # not yet handed to the database
        self._spans: list[dict] = []
        self._lock = threading.Lock()  # guards _pending and _spans; held only to append or take
        self._write_lock = threading.Lock()  # one write at a time, in seq order
        self._wake = threading.Condition(self._lock)
        self._flusher: threading.Thread | None = None
        self._closing = False
        self.lost: BaseException | None = None
        self.writes = 0  # transactions committed (benchmarks read it)
        self._named: set[str] = set()  # step names this writer has put in the search summary

    # -- recording -------------------------------------------------------------------
    def record(
        self,
        kind: str,
        payload: dict,
        *,
        position: int | None = None,
        step_name: str = "",
        actor: str = "",
        durability: str | None = None,
        created_at: datetime | None = None,
        extra: Callable[[], None] | None = None,
        raw: dict[str, str] | None = None,
    ) -> int:
        """Record one entry; returns its seq. ``extra`` runs in the same transaction (forces a sync write).

        ``raw`` maps payload keys to JSON text already encoded (a step's arguments and result were
        encoded once to validate and fingerprint them; encoding them again is most of a step's cost).
        """
        if self.lost is not None:
            raise self._dead()
        mode = durability or self.mode
        # What a step produced (an error message, command output) is made storable here, the one
        # place every journal entry passes: a NUL or lone surrogate is escaped, never a failed write.
        text = storable_json(COMPACT(payload))
        if raw:
            spliced = ",".join(f'"{key}":{value}' for key, value in raw.items())
            text = f"{text[:-1]},{spliced}}}" if len(text) > 2 else f"{{{spliced}}}"
        with self._lock:
            seq = self.next_seq
            self.next_seq += 1
            self._pending.append(
                Entry(seq, kind, position, step_name, text, actor, created_at or datetime.now(UTC))
            )
            if mode == "async" and extra is None:
                self._ensure_flusher()
                self._wake.notify()
                return seq
            if mode == "exit" and extra is None:
                return seq
        self._flush(extra)
        return seq

    def add_span(self, span: dict) -> None:
        with self._lock:
            self._spans.append(span)

    def barrier(self, extra: Callable[[], None] | None = None) -> None:
        """Make everything recorded so far durable (and run ``extra`` in that transaction)."""
        if self.lost is not None:
            raise self._dead()
        self._flush(extra, spans=True)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self._flusher is not None:
            self._flusher.join(timeout=30)

    # -- writing ---------------------------------------------------------------------
    def _flush(self, extra: Callable[[], None] | None, spans: bool = False) -> None:
        """Write what is pending, in order. Writes are serialised by ``_write_lock``; ``_lock`` is
        held only to take the batch, so the driving thread keeps recording (async mode) while
        the background thread waits for its commit."""
        with self._write_lock:
            with self._lock:
                batch, self._pending = self._pending, []
                span_batch: list[dict] = []
                if spans or extra is not None or len(self._spans) >= SPAN_BATCH:
                    span_batch, self._spans = self._spans, []
            if batch or span_batch or extra is not None:
                self._write(batch, span_batch, extra)

    def _write(self, batch: list[Entry], span_batch: list[dict], extra: Callable[[], None] | None) -> None:
        last = batch[-1] if batch else None
        if faults.armed:
            faults.inject("before_commit", position=last and last.position, kind=last and last.kind, run_id=self.run_id)
        names = self._new_names(batch)
        try:
            self._write_retrying(batch, span_batch, extra, names)
        except LeaseLost as exc:
            self.lost = exc
            raise
        except DatabaseUnavailable as exc:
            self.lost = exc  # this writer is done: the run is given back, the next claim reads what committed
            self._forget(batch)
            raise
        except BaseException:
            self._forget(batch)  # the write did not commit: its seq numbers were never taken
            raise
        self.writes += 1
        self._named.update(names)
        if span_batch and SPAN_LISTENERS:  # telemetry sees spans once they are durable, never fails a write
            transaction.on_commit(lambda: _tell_listeners(self.run_id, span_batch))
        if faults.armed:
            faults.inject("after_commit", position=last and last.position, kind=last and last.kind, run_id=self.run_id)

    def _new_names(self, batch: list[Entry]) -> list[str]:
        """Step names in this batch not yet in the search summary: the first time a run records a step
        name its commit carries one more INSERT (ignored if present); later steps of that name, none."""
        named = self._named
        if len(batch) == 1:  # a sync step's write: no set to build
            e = batch[0]
            return [e.step_name] if e.step_name and e.kind == EventKind.STEP_COMPLETED and e.step_name not in named \
                else []
        names = {e.step_name for e in batch if e.step_name and e.kind == EventKind.STEP_COMPLETED} - named
        return sorted(names)

    def _write_retrying(self, batch: list[Entry], span_batch: list[dict], extra: Callable[[], None] | None,
                        names: list[str]) -> None:
        """One write, retried through a database outage with bounded exponential backoff.

        Retrying is safe because a write is one transaction: it committed or it did not. When the
        failure came at (or after) the commit, the answer may have been lost; the entries' own seq
        numbers say which (under an epoch that is still ours nobody else can have written them).
        Inside a caller's transaction nothing is retried: that transaction is gone with the connection.
        """
        delays = None
        while True:
            committing = [False]
            try:
                self._attempt(batch, span_batch, extra, committing, names)
                return
            except LeaseLost:
                raise
            except Exception as exc:
                if not outage.is_database_outage(exc):
                    raise
                if connection.in_atomic_block:
                    raise outage.unavailable(exc, "writing the journal") from exc
                error: BaseException = exc
            in_doubt = committing[0]
            delays = delays if delays is not None else outage.backoff(outage.retry_seconds())
            while True:  # wait for the database; find out whether an in-doubt commit went through
                delay = next(delays, None)
                if delay is None:
                    raise outage.unavailable(error, f"writing the journal of run {self.run_id}") from error
                outage.drop_connection()
                time.sleep(delay)
                if not in_doubt:
                    break
                try:
                    if self._committed(batch):
                        return
                    break
                except LeaseLost:
                    raise
                except Exception as exc:
                    if not outage.is_database_outage(exc):
                        raise
                    error = exc
            log.info("run %s: retrying a journal write after %s", self.run_id, type(error).__name__)

    def _attempt(self, batch: list[Entry], span_batch: list[dict], extra: Callable[[], None] | None,
                 committing: list[bool], names: list[str]) -> None:
        last = batch[-1] if batch else None
        if faults.armed:
            faults.inject("db_write", position=last and last.position, kind=last and last.kind, run_id=self.run_id)
        conn = connections[DEFAULT_DB_ALIAS]  # this thread's connection, looked up once for the write
        if batch and extra is None and not names and groupcommit.enabled(conn):
            committing[0] = True  # the commit may be another thread's: any failure may have come after it
            _group(conn.alias).submit((self, batch, span_batch))
        else:
            self._commit(batch, span_batch, committing, extra, names)
        if faults.armed:
            faults.inject("db_reply", position=last and last.position, kind=last and last.kind, run_id=self.run_id)

    def _commit(self, batch: list[Entry], span_batch: list[dict], committing: list[bool],
                extra: Callable[[], None] | None = None, names: list[str] = ()) -> None:
        """This writer's rows committed on their own: one autocommitted statement when that is all there is.

        ``names`` are step names new to the search summary: their rows commit with this write."""
        if len(batch) == 1 and not span_batch and extra is None and not names:
            committing[0] = True  # autocommit: the statement is its commit
            fenced_append(self.run_id, self.epoch, batch)  # one statement, one commit
        elif (move := _foldable(extra, batch, span_batch)) is not None:
            committing[0] = True  # one statement again: the move or the fence, the spans, names and rows
            _append_together(self.run_id, self.epoch, batch, span_batch, names, move or None)
        else:
            # The engine's own statements (and a move's UPDATE) need none of atomic()'s bookkeeping on
            # SQLite (prepared.own_transaction); a checkpoint's or a wake check's ORM writes do.
            own = extra is None or isinstance(extra, runstate.FencedMove)
            with prepared.own_transaction() if own else transaction.atomic():
                if batch:
                    fenced_append(self.run_id, self.epoch, batch)
                elif extra is not None:
                    self._check_epoch()
                if names:
                    record_step_names(self.run_id, names)
                if span_batch:
                    _insert_spans(self.run_id, span_batch)
                if extra is not None:
                    extra()
                committing[0] = True  # from here a failure may come after the commit went through

    def _committed(self, batch: list[Entry]) -> bool:
        """After a failure at commit: did the write go through? (False when there is nothing to tell by.)"""
        if not Run.objects.filter(id=self.run_id, epoch=self.epoch).exists():
            raise LeaseLost(f"run {self.run_id} was claimed by another worker while the database was away")
        if not batch:
            raise outage.unavailable(OperationalError("a commit without journal entries is in doubt"))
        return SessionEvent.objects.filter(run_id=self.run_id, seq=batch[-1].seq).exists()

    def _forget(self, batch: list[Entry]) -> None:
        """A write that did not commit gives its seq numbers back: entries recorded since move down, so
        the session log stays 1..N with no gaps."""
        if not batch:
            return
        with self._lock:
            first = batch[0].seq
            for i, entry in enumerate(self._pending):
                entry.seq = first + i
            self.next_seq = first + len(self._pending)

    def _dead(self) -> BaseException:
        if isinstance(self.lost, DatabaseUnavailable):
            return DatabaseUnavailable(str(self.lost))
        return LeaseLost(str(self.lost))

    def _check_epoch(self) -> None:
        qs = Run.objects.filter(id=self.run_id, epoch=self.epoch)
        if connection.vendor == "postgresql":
            qs = qs.select_for_update()
        if not qs.exists():
            raise LeaseLost(f"run {self.run_id} was claimed by another worker")

    def _ensure_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name=f"journal-writer-{self.run_id}", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._pending and not self._closing:
                        self._wake.wait()
                    if not self._pending and self._closing:
                        return
                try:
                    self._flush(None)
                except (LeaseLost, DatabaseUnavailable):
                    return  # kept in self.lost for the driving thread
                except Exception as exc:  # keep the error for the driving thread
                    log.exception("async journal writer failed for run %s", self.run_id)
                    self.lost = exc
                    return
        finally:
            connections.close_all()


def _write_one(item: tuple[JournalWriter, list[Entry], list[dict]]) -> None:
    writer, batch, span_batch = item
    writer._commit(batch, span_batch, [True])


def _write_many(items: Sequence[tuple[JournalWriter, list[Entry], list[dict]]]) -> dict[int, BaseException]:
    """Several runs' rows in one commit, each behind its own run's fence.

    One autocommitted statement for all of them (``_fenced_insert_group``: one round trip on
    PostgreSQL, one fsync on SQLite) when no spans ride along; the rows it returns say whose fence
    held. Otherwise one statement per run inside one transaction."""
    rows = sum(len(batch) for _, batch, _ in items)
    if rows <= GROUP_ROWS and not any(spans for _, _, spans in items):
        inserted = _fenced_insert_group([(w.run_id, w.epoch, batch) for w, batch, _ in items])
        return {i: _lost(w) for i, (w, _, _) in enumerate(items) if w.run_id not in inserted}
    refused: dict[int, BaseException] = {}
    with prepared.own_transaction():
        for i, (writer, batch, span_batch) in enumerate(items):
            try:
                fenced_append(writer.run_id, writer.epoch, batch)
            except LeaseLost as exc:
                refused[i] = exc
                continue
            if span_batch:
                _insert_spans(writer.run_id, span_batch)
    return refused


def _lost(writer: JournalWriter) -> LeaseLost:
    return LeaseLost(f"run {writer.run_id} was claimed by another worker (epoch {writer.epoch} is stale)")


GROUP_ROWS = 64  # a group larger than this is written statement by statement in one transaction
_GROUP_SQL: dict[tuple[str, int], str] = {}


def _fenced_insert_group(parts: list[tuple[uuid.UUID, int, list[Entry]]]) -> set[uuid.UUID]:
    """Every part's rows in one autocommitted INSERT, each row kept only if its run's epoch still holds
    (on PostgreSQL under the same share lock on the run row as the single-run fence; SQLite's one
    writer makes the check and the insert one step). Returns the runs whose rows went in.

    On SQLite too: one statement per run inside a transaction held the process's writer queue while
    the thread took the GIL back after each statement from the seven others running Python (a hold
    of eight runs' steps lasted ~0.85 ms, half of it waiting); one statement takes it back once."""
    conn = connections[DEFAULT_DB_ALIAS]
    pg = conn.vendor == "postgresql"
    rows = sum(len(entries) for _, _, entries in parts)
    sql = _GROUP_SQL.get((conn.vendor, rows))
    if sql is None:
        if pg:
            values = ", ".join([_PG_ROW[:-1] + ", %s::bigint)"] * rows)
            sql = (f"INSERT INTO journal_sessionevent ({_COLS}) SELECT {_COLS} FROM (VALUES {values}) "
                   f"AS v({_COLS}, epoch) WHERE EXISTS (SELECT 1 FROM journal_run r WHERE r.id = v.run_id "
                   "AND r.epoch = v.epoch FOR SHARE) RETURNING run_id")
        else:  # SQLite names a VALUES list's columns column1, column2, …: the run is the first, the epoch the ninth
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * rows)
            picked = ", ".join(f"v.column{i}" for i in range(1, 9))
            sql = (f"INSERT INTO journal_sessionevent ({_COLS}) SELECT {picked} FROM (VALUES {values}) AS v "
                   "WHERE EXISTS (SELECT 1 FROM journal_run r WHERE r.id = v.column1 AND r.epoch = v.column9) "
                   "RETURNING run_id")
        _GROUP_SQL[(conn.vendor, rows)] = sql
    params: list[Any] = []
    for run_id, epoch, entries in parts:
        run_param: Any = run_id if pg else run_id.hex
        for e in entries:
            created: Any = e.created_at if pg else _sqlite_datetime(e.created_at)
            params += [run_param, e.seq, e.kind, e.position, e.step_name, e.payload, e.actor, created, epoch]
    with prepared.cursor() as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchall()
    return {row[0] if pg else uuid.UUID(row[0]) for row in returned}


_GROUPS: dict[str, groupcommit.GroupCommit] = {}
_GROUPS_LOCK = threading.Lock()


def _group(alias: str = DEFAULT_DB_ALIAS) -> groupcommit.GroupCommit:
    """This process's commit queue for the database the calling thread writes to."""
    group = _GROUPS.get(alias)
    if group is None:
        with _GROUPS_LOCK:
            group = _GROUPS.setdefault(alias, groupcommit.GroupCommit(_write_one, _write_many))
    return group


_SPAN_COLS = ("span_id", "parent_span_id", "name", "kind", "position", "attempt", "status", "error", "started_at",
              "ended_at", "duration_ms", "model", "tokens_in", "tokens_out", "cost", "attributes")


def _insert_spans(run_id: uuid.UUID, spans: list[dict]) -> None:
    """Raw executemany: the ORM's per-field preparation cost more than the whole step it traced."""
    conn = connections[DEFAULT_DB_ALIAS]
    pg = conn.vendor == "postgresql"
    if pg and len(spans) >= COPY_ROWS:
        with conn.cursor() as cursor, cursor.cursor.copy(
                f"COPY journal_tracespan (run_id, {', '.join(_SPAN_COLS)}) FROM STDIN") as copy:
            for span in spans:
                copy.write_row(_span_row(run_id, span, pg=True, copying=True))
        return
    placeholders = ", ".join(["%s::jsonb" if pg and c == "attributes" else "%s" for c in ("run_id", *_SPAN_COLS)])
    sql = f"INSERT INTO journal_tracespan (run_id, {', '.join(_SPAN_COLS)}) VALUES ({placeholders})"
    run_param = run_id if pg else run_id.hex
    rows = [_span_row(run_param, span, pg=pg) for span in spans]
    if pg:
        with conn.cursor() as cursor:
            cursor.executemany(sql, rows)
        return
    with conn.wrap_database_errors:  # sqlite3's own cursor: Django's rewrites the placeholders per call
        prepared.kept_cursor(conn, True).executemany(sql, rows)


def _span_row(run_param: Any, span: dict, *, pg: bool, copying: bool = False) -> list[Any]:
    """A span as the row its columns take (``_SPAN_COLS`` after the run), its outside texts storable.

    Written out column by column: this runs once per traced step, and a loop over the columns
    with a default and a type test each cost more than the rest of the span's write."""
    get = span.get
    started, ended = get("started_at"), get("ended_at")
    cost = get("cost", 0)
    attributes = get("attributes")
    if not pg:
        started = _sqlite_datetime(started) if started is not None else None
        ended = _sqlite_datetime(ended) if ended is not None else None
        cost = float(cost or 0)
    elif not copying:
        cost = Decimal(str(cost or 0))
    # The span's own id, kind and status are the engine's words (hex, SpanKind, "ok"/"error"); the
    # texts that can come from outside (names, errors, models, a parent's id) are made storable.
    model, parent = get("model", ""), get("parent_span_id", "")
    return [
        run_param, get("span_id"), _text(parent) if parent else parent, _text(get("name")), get("kind", "step"),
        get("position"), get("attempt", 1), get("status", "ok"), _text(get("error", "")), started, ended,
        get("duration_ms", 0.0), _text(model) if model else model, get("tokens_in", 0), get("tokens_out", 0), cost,
        storable_json(json.dumps(attributes, separators=(",", ":"), default=str)) if attributes else "{}",
    ]


def _text(value: Any) -> Any:
    return storable_text(value) if isinstance(value, str) else value


FOLD_ROWS = 8  # a write carrying at most this many rows may be one statement (PostgreSQL)


def _foldable(extra: Callable[[], None] | None, batch: list[Entry], spans: list[dict]) -> tuple[str, list] | None:
    """Whether PostgreSQL can take this write as one statement (``_append_together``): its extra is
    nothing or the driving worker's fenced move. Returns the move's UPDATE, ``()`` for a write
    without one, None for a write that needs its transaction."""
    if not batch or len(batch) > FOLD_ROWS or len(spans) > SPAN_BATCH or connection.vendor != "postgresql":
        return None
    if extra is None:
        return ()
    if isinstance(extra, runstate.FencedMove):
        return extra.statement()
    return None


_SPAN_TYPES = {"span_id": "varchar", "parent_span_id": "varchar", "name": "varchar", "kind": "varchar",
               "position": "integer", "attempt": "integer", "status": "varchar", "error": "text",
               "started_at": "timestamptz", "ended_at": "timestamptz", "duration_ms": "double precision",
               "model": "varchar", "tokens_in": "integer", "tokens_out": "integer", "cost": "numeric",
               "attributes": "jsonb"}
_TOGETHER_SQL: dict[tuple, str] = {}
_GATE = "EXISTS (SELECT 1 FROM gate)"


def _append_together(run_id: uuid.UUID, epoch: int, entries: list[Entry], spans: list[dict], names: list[str],
                     move: tuple[str, list] | None) -> None:
    """PostgreSQL: a write that would be a transaction of several statements, as one statement.

    The first leg of a ``WITH`` is the gate: the run's fenced move (``UPDATE … RETURNING 1``), or
    without one the fence itself (the run's row at our epoch, ``FOR SHARE``, read once). Every
    INSERT (the trace spans, the step names new to the search summary, the journal rows) keeps its
    rows only if the gate let one through, so it is all or none, as the transaction it replaces
    was, and one round trip where that took four or five (BEGIN, the INSERTs, the UPDATE, COMMIT).
    A move's UPDATE holds the row lock, stronger than the append's share lock. The spans travel
    as one JSON array, so one prepared statement serves any number of them."""
    keys = step_keys(names)
    shape = (move[0] if move else None, len(entries), bool(spans), len(keys))
    sql = _TOGETHER_SQL.get(shape)
    if sql is None:
        legs = [f"gate AS ({move[0]} RETURNING 1)" if move else
                "gate AS (SELECT 1 FROM journal_run WHERE id = %s AND epoch = %s FOR SHARE)"]
        if spans:
            cols = ", ".join(_SPAN_COLS)
            typed = ", ".join(f"{col} {kind}" for col, kind in _SPAN_TYPES.items())
            legs.append(f"traced AS (INSERT INTO journal_tracespan (run_id, {cols}) SELECT %s::uuid, {cols} "
                        f"FROM jsonb_to_recordset(%s::jsonb) AS s({typed}) WHERE {_GATE})")
        if keys:
            named = ", ".join(["(%s::uuid, %s::varchar, false)"] * len(keys))
            legs.append(f"named AS (INSERT INTO journal_runstep (run_id, name, failed) SELECT * FROM "
                        f"(VALUES {named}) AS n WHERE {_GATE} ON CONFLICT DO NOTHING)")
        sql = _TOGETHER_SQL[shape] = (
            f"WITH {', '.join(legs)} INSERT INTO journal_sessionevent ({_COLS}) SELECT * FROM "
            f"(VALUES {', '.join([_PG_ROW] * len(entries))}) AS v WHERE {_GATE}")
    params = list(move[1]) if move else [run_id, epoch]
    if spans:
        params += [run_id, _spans_json(spans)]
    for key in keys:
        params += [run_id, key]
    for e in entries:
        params += [run_id, e.seq, e.kind, e.position, e.step_name, e.payload, e.actor, e.created_at]
    if prepared.execute(connections[DEFAULT_DB_ALIAS], sql, params) != len(entries):
        raise LeaseLost(f"run {run_id} was claimed by another worker (epoch {epoch} is stale)")


def _spans_json(spans: list[dict]) -> str:
    """Spans as one JSON array of records, stored as ``_insert_spans`` stores them (a NUL or a lone
    surrogate in a name or an error becomes its escape as text). Written out key by key, as
    ``_span_row`` is: a settle carries every span of a short run, and a loop over the columns with a
    default and a type test each was the settle's largest cost after its round trip."""
    records = []
    for span in spans:
        get = span.get
        started, ended = get("started_at"), get("ended_at")
        records.append({
            "span_id": get("span_id"), "parent_span_id": get("parent_span_id", ""), "name": get("name"),
            "kind": get("kind", "step"), "position": get("position"), "attempt": get("attempt", 1),
            "status": get("status", "ok"), "error": get("error", ""),
            "started_at": started.isoformat() if isinstance(started, datetime) else started,
            "ended_at": ended.isoformat() if isinstance(ended, datetime) else ended,
            "duration_ms": get("duration_ms", 0.0), "model": get("model", ""), "tokens_in": get("tokens_in", 0),
            "tokens_out": get("tokens_out", 0), "cost": str(get("cost", 0) or 0),
            "attributes": get("attributes") or {},
        })
    return storable_json(json.dumps(records, separators=(",", ":"), default=str))


def _tell_listeners(run_id: uuid.UUID, spans: list[dict]) -> None:
    for listener in list(SPAN_LISTENERS):
        try:
            listener(run_id, spans)
        except Exception:
            log.exception("a span listener failed for run %s", run_id)
