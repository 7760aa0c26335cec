"""Django's SQLite backend, with this process's writers queued on a lock of its own.

SQLite lets one connection write at a time. A connection that finds the write lock taken waits in
SQLite's busy handler, which sleeps 1, 2, 5, 10 … ms between looks: eight worker threads whose
writes last a tenth of a millisecond each spent most of their time asleep, and eight concurrent
runs went slower than one (135-145 runs/s against 190, measured with bench/peers' workload).

Here every write of this process first takes a lock per database file: a transaction from its
``BEGIN IMMEDIATE`` to its commit or rollback (or the connection's close), a write outside a
transaction for its statement. A waiting thread then wakes the moment the writer before it is done.
The lock is taken before SQLite's, never while holding it, so the two cannot deadlock. A writer
waits for it at most the connection's ``timeout`` and then fails as SQLite would ("database is
locked"); once it holds it, other processes' writers are met on SQLite's own lock, with SQLite's
own wait, as before. Readers take nothing (WAL).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_LOCK = threading.Lock()


def _lock_for(name: str) -> threading.RLock:
    lock = _LOCKS.get(name)
    if lock is None:
        with _LOCKS_LOCK:
            lock = _LOCKS.setdefault(name, threading.RLock())
    return lock


def is_write(sql: str) -> bool:
    """Anything but a read takes the write lock (a conservative guess errs towards queuing)."""
    return sql.lstrip()[:6].upper() not in ("SELECT", "PRAGMA")


class _Queued:
    """This process's writers of one database file, one at a time; ``with queued:`` holds the turn."""

    def __init__(self, name: str, timeout: float):
        self.lock = _lock_for(name)
        self.timeout = timeout

    def acquire(self) -> None:
        # Django's own OperationalError, as SQLite's "database is locked" reaches the engine through
        # Django's wrapper: an outage to wait out, never the workflow's failure (journal.store.outage).
        if not self.lock.acquire(timeout=self.timeout):
            raise OperationalError("database is locked")

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def turn(queued: _Queued | None, connection: sqlite3.Connection, sql: str) -> Any:
    """What a statement holds while it runs: the writers' turn for a write outside a transaction (a
    transaction took it at BEGIN), nothing for a read or without the queue (Django's stock backend)."""
    if queued is None or connection.in_transaction or not is_write(sql):
        return nullcontext()
    return queued


class CursorWrapper(base.SQLiteCursorWrapper):
    """A write outside a transaction holds the writers' turn for its statement."""

    queued: _Queued

    def execute(self, query: str, params: Any = None) -> Any:
        with turn(self.queued, self.connection, query):
            return super().execute(query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        with turn(self.queued, self.connection, query):
            return super().executemany(query, param_list)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict) -> sqlite3.Connection:
        conn = super().get_new_connection(conn_params)
        self.queued = _Queued(str(self.settings_dict["NAME"]), float(conn_params.get("timeout", 5)))
        self._holding = False
        self.synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]  # 0 OFF … 2 FULL, 3 EXTRA
        self.wal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
        return conn

    @contextmanager
    def synced_later(self) -> Iterator[None]:
        """Commits made inside reach the write-ahead log, and the disk with the next commit that syncs.

        In WAL mode a commit at ``synchronous=FULL`` syncs the log, and with it every frame written
        before it; one at ``NORMAL`` does not sync, and only a power cut or an OS crash before the next
        syncing commit can take it back (a killed process cannot: the frames are in the OS's cache, and
        readers see the commit at once either way). Meant for a write whose loss at a power cut the next
        durable write covers: a claim's move, which nothing outside the database acts on before the run's
        next record (an effect commits its intent first, an atomic step its barrier) syncs it too,
        whichever connection of the process makes it (an fsync flushes the file, not one descriptor's
        writes). Only in WAL mode: with a rollback journal, NORMAL could corrupt the file at a power cut."""
        self.ensure_connection()
        raw = self.connection
        if not self.wal or self.synchronous < 2 or raw.in_transaction:  # nothing to defer, or not its to decide
            yield
            return
        with self.wrap_database_errors:  # a failure is Django's error, as every other statement's (an outage)
            raw.execute("PRAGMA synchronous=NORMAL")
        try:
            yield
        finally:
            if self.connection is raw:  # (a connection closed inside is gone, and its setting with it)
                with self.wrap_database_errors:
                    raw.execute(f"PRAGMA synchronous={self.synchronous}")

    def create_cursor(self, name: str | None = None) -> Any:
        cursor = self.connection.cursor(factory=CursorWrapper)
        cursor.queued = self.queued
        return cursor

    def _start_transaction_under_autocommit(self) -> None:
        self.queued.acquire()
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self.queued.release()
            raise
        self._holding = True

    def _let_go(self) -> None:
        if getattr(self, "_holding", False):
            self._holding = False
            self.queued.release()

    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            if not (self.connection is not None and self.connection.in_transaction):
                self._let_go()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._let_go()

    def _close(self) -> None:
        try:
            super()._close()
        finally:
            self._let_go()
