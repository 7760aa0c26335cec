"""The engine's per-step statements: prepared statements on PostgreSQL, sqlite3's own cursor on SQLite.

Django sends every query as text with its values quoted in (client-side binding) and turns
psycopg's prepared statements off, so that connection poolers in transaction mode keep working.
For the journal's append, the statement every step of every run makes, that means PostgreSQL
parses and plans the same INSERT each time: planning it cost about as much as executing it (a step
took ~470 µs unprepared against ~285 µs prepared, measured through psycopg on this machine).

``cursor()`` gives those few statements a server-side-binding psycopg cursor on Django's own
connection (same session, same transaction, Django's error translation), and asks psycopg to
prepare each statement once per connection. ``DURABLE_PG_PREPARE=0`` turns it off for a pooler that
cannot carry prepared statements (PgBouncer before 1.21 in transaction mode). On SQLite it is
sqlite3's own cursor, whose module caches compiled statements by text anyway; what it saves there is
Django's wrapper (a regex per execute). Either cursor is kept for the connection's life.
Statements still appear in ``connection.queries`` when Django logs queries, so tests counting them agree.
``execute()``, for the writes that need only a row count, goes one step further on PostgreSQL: straight
through libpq with its values as text (``journal.store.wire``), psycopg's cursor where that cannot be.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.signals import connection_created

from journal.store import wire
from journal.store.sqlite_backend.base import is_write

PSYCOPG_DEFAULT_THRESHOLD = 5  # what psycopg uses when Django does not switch preparing off

CACHED_PARAMS = 128


def _tune_psycopg() -> Any:
    """psycopg, imported when the first PostgreSQL connection opens (a SQLite process never pays its
    80-90 ms of import at start-up), with its parse cache widened.

    psycopg parses a statement's text for its placeholders on every execute, and caches the parse
    (a bounded LRU of 128) only for statements of at most 50 parameters. A run's start (the Run row
    and its first event in one statement, journal.store.frozen.insert_all) has 54: it was parsed anew
    on every start, 0.26 ms of CPU, a quarter of a short run's. Let the cache take statements of up to
    128; psycopg reads the limit at each call, and an unknown attribute (another psycopg) costs nothing."""
    import psycopg
    import psycopg._queries

    if getattr(psycopg._queries, "MAX_CACHED_STATEMENT_PARAMS", CACHED_PARAMS) < CACHED_PARAMS:
        psycopg._queries.MAX_CACHED_STATEMENT_PARAMS = CACHED_PARAMS
    return psycopg


def _tune_on_connect(sender: Any, connection: Any, **_kwargs: Any) -> None:
    """Every PostgreSQL connection, the hot statements' and Django's own (``DURABLE_PG_PREPARE=0``), finds
    the parse cache widened before its first statement."""
    if connection.vendor == "postgresql":
        _tune_psycopg()


connection_created.connect(_tune_on_connect, dispatch_uid="journal.store.prepared.tune_psycopg")


def enabled(conn: Any = None) -> bool:
    conn = conn if conn is not None else connections[DEFAULT_DB_ALIAS]
    return conn.vendor == "postgresql" and os.environ.get("DURABLE_PG_PREPARE", "1") != "0"


class _PreparedCursor:
    """The part of a DB-API cursor the hot statements use, each ``execute`` a prepared statement.
    One per connection, kept for its life (making a psycopg cursor per step cost more than using one)."""

    def __init__(self, conn: Any, raw: Any, prepare: bool = True):
        self._conn = conn
        self._raw = raw
        self._prepare = prepare

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        started = time.monotonic()
        self._raw.execute(sql, params, prepare=self._prepare)
        self._logged(sql, params, started, "prepared" if self._prepare else "bound")

    def _logged(self, sql: str, params: Sequence[Any], started: float, how: str) -> None:
        """Into ``connection.queries`` as Django's debug cursor would put it, when Django logs queries."""
        if self._conn.queries_logged:
            self._conn.queries_log.append({"sql": f"{sql} -- {how}, params {list(params)!r}"[:10000],
                                           "time": f"{time.monotonic() - started:.3f}"})

    @property
    def rowcount(self) -> int:
        return self._raw.rowcount

    def fetchone(self) -> tuple | None:
        return self._raw.fetchone()

    def fetchall(self) -> list[tuple]:
        return self._raw.fetchall()

    @property
    def lastrowid(self) -> int | None:  # sqlite3's; a PostgreSQL insert says RETURNING instead
        return getattr(self._raw, "lastrowid", None)


_NO_TURN = nullcontext()  # reusable: it holds nothing


class _SQLiteCursor(_PreparedCursor):
    """SQLite's own cursor on Django's connection, kept for the connection's life, with the statement's
    placeholders converted once (Django's wrapper rewrites %s to ? with a regex on every execute); the
    sqlite3 module keeps the compiled statement in its cache by text."""

    _converted: dict[str, tuple[str, bool, bool]] = {}
    _rows: list[tuple] | None = None  # a write's RETURNING rows, read while it held the writers' turn

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        self._run(self._raw.execute, sql, params)
        self._logged(sql, params, self._started, "sqlite3 cursor")

    def fetchone(self) -> tuple | None:
        if self._rows is not None:
            return self._rows.pop(0) if self._rows else None
        return self._raw.fetchone()

    def fetchall(self) -> list[tuple]:
        if self._rows is not None:
            rows, self._rows = self._rows, None
            return rows
        return self._raw.fetchall()

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._run(self._raw.executemany, sql, rows)
        self._logged(sql, [len(rows)], self._started, f"sqlite3 cursor, {len(rows)} rows")

    def _run(self, call: Any, sql: str, params: Any) -> None:
        """``call`` (the raw cursor's execute or executemany) with the placeholders converted, a write
        outside a transaction queued behind this process's other writers (sqlite_backend)."""
        converted = self._converted.get(sql)
        if converted is None:
            write = is_write(sql)
            converted = self._converted[sql] = (sql.replace("%s", "?"), write, write and " RETURNING " in sql)
        query, write, returning = converted
        self._started = time.monotonic()
        self._rows = None
        # A write outside a transaction holds the writers' turn (``sqlite_backend.turn``, with the
        # statement's kind known already); Django's stock backend has no queue.
        queued = getattr(self._conn, "queued", None) if write and not self._raw.connection.in_transaction else None
        with queued or _NO_TURN:
            call(query, params)
            if returning:  # sqlite3 finishes such a statement only when its last row is read, and until
                self._rows = self._raw.fetchall()  # then its connection cannot commit: read them now


def kept_cursor(conn: Any, prepare: bool) -> _PreparedCursor | None:
    """The connection's kept cursor for hot statements (made on first use), or None when preparing
    is switched off on PostgreSQL (Django's own cursor serves then)."""
    if conn.vendor == "sqlite":
        if conn.connection is None:  # ensure_connection() itself costs an async check a call
            conn.ensure_connection()
        raw_connection = conn.connection
        kept = getattr(conn, "_durable_sqlite", None)
        if kept is None or kept._raw.connection is not raw_connection:
            kept = conn._durable_sqlite = _SQLiteCursor(conn, raw_connection.cursor())
        return kept
    if not enabled(conn):
        return None
    if conn.connection is None:  # ensure_connection() itself costs an async check a call
        conn.ensure_connection()
    raw_connection = conn.connection
    slot = "_durable_prepared" if prepare else "_durable_bound"
    kept = getattr(conn, slot, None)
    if kept is None or kept._raw.connection is not raw_connection or kept._raw.closed:
        if raw_connection.prepare_threshold is None:  # Django's default: prepare=True would be ignored
            raw_connection.prepare_threshold = PSYCOPG_DEFAULT_THRESHOLD
        kept = _PreparedCursor(conn, _tune_psycopg().Cursor(raw_connection), prepare)
        setattr(conn, slot, kept)
    return kept


@contextmanager
def cursor(prepare: bool = True) -> Iterator[Any]:
    """A cursor for a hot statement: prepared on PostgreSQL, sqlite3's own on SQLite (see the module
    docstring), Django's when preparing is switched off.

    ``prepare=False`` keeps the server-side binding (no quoting in Python) but lets PostgreSQL plan
    each execution for its values: for statements whose values decide which partial index applies
    (a claim's ``status = 'pending'``), which a prepared statement's generic plan could not use."""
    conn = connections[DEFAULT_DB_ALIAS]  # one lookup of the thread's connection, not one per attribute
    kept = kept_cursor(conn, prepare)
    if kept is None:
        with conn.cursor() as django_cursor:
            yield django_cursor
        return
    with conn.wrap_database_errors:
        yield kept


@contextmanager
def own_transaction() -> Iterator[None]:
    """All or none for a few of the engine's own statements: ``transaction.atomic()``, or on SQLite
    outside any atomic block a bare ``BEGIN IMMEDIATE`` … ``COMMIT`` holding this process's writers'
    turn (``sqlite_backend``) throughout.

    Django's ``atomic()`` keeps books around the transaction (autocommit switched off and on, the
    savepoint state, commit hooks) that cost more CPU than the transaction itself: 86 µs against 31 µs
    for a BEGIN, one INSERT and a COMMIT (SQLite, 20,000 of each, three rounds), and a short run makes
    three such transactions (its start, its first step's write, its settle). Django does not know of
    the bare one, so what runs inside must not ask it for one: the statements of this module and of
    ``frozen``, raw cursors, and ORM queries that open no ``atomic()`` of their own (a queryset's
    ``update`` or ``exists``); never a model's ``save`` nor ``transaction.on_commit``."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "sqlite" or conn.in_atomic_block:
        with transaction.atomic():
            yield
        return
    if conn.connection is None:  # ensure_connection() itself costs an async check a call
        conn.ensure_connection()
    queued = getattr(conn, "queued", None)
    if queued is None:  # Django's stock SQLite backend: no queue to hold
        with transaction.atomic():
            yield
        return
    raw = conn.connection
    with queued:
        with conn.wrap_database_errors:
            raw.execute("BEGIN IMMEDIATE")
        try:
            yield
            with conn.wrap_database_errors:
                raw.execute("COMMIT")
        except BaseException:
            if raw.in_transaction:  # a failed statement, or a COMMIT that failed and left it open
                try:
                    raw.rollback()
                except Exception:  # noqa: S110 - the connection is gone: so is the transaction
                    pass
            raise


def execute(conn: Any, sql: str, params: Sequence[Any]) -> int:
    """Run one hot write on ``conn`` (the caller's thread's connection) and return its row count:
    what ``with cursor() as c: c.execute(...)`` does, without a generator per statement (the
    journal's append, once per step). On PostgreSQL straight through libpq (``journal.store.wire``)
    when its values allow."""
    if conn.vendor == "postgresql" and enabled(conn):
        count = wire.execute(conn, sql, params)
        if count is not None:
            return count
    kept = kept_cursor(conn, True)
    if kept is None:
        with conn.cursor() as django_cursor:
            django_cursor.execute(sql, params)
            return django_cursor.rowcount
    with conn.wrap_database_errors:
        kept.execute(sql, params)
        return kept.rowcount
