"""The floor: the least any durable engine must do, one INSERT + COMMIT per step, straight through
``sqlite3`` or psycopg (no Django, no fencing, no trace, no replay).

A run is one row (inserted, then marked done) and one row per step, each its own autocommitted
statement, so a run of n steps costs n + 2 commits. SQLite is in WAL mode with synchronous=FULL,
as durable-ui configures it; PostgreSQL keeps its defaults (fsync and synchronous_commit on).
"""

from __future__ import annotations

import sqlite3
import threading

import psycopg

from .databases import Store
from .workloads import message, threaded

SCHEMA = [
    "CREATE TABLE run (id {pk}, status TEXT NOT NULL, input TEXT, output TEXT)",
    "CREATE TABLE step (run_id BIGINT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, output TEXT, "
    "PRIMARY KEY (run_id, seq))",
]


class Floor:
    name = "floor"
    modes = ("sync",)

    def __init__(self, store: Store) -> None:
        self.store = store
        self._local = threading.local()
        self._all: list = []
        self._lock = threading.Lock()
        pk = "INTEGER PRIMARY KEY" if store.kind == "sqlite" else "BIGSERIAL PRIMARY KEY"
        conn = self._conn()
        for ddl in SCHEMA:
            conn.execute(ddl.format(pk=pk))
        self.mark = "?" if store.kind == "sqlite" else "%s"

    def _conn(self):
        """One connection per thread, in autocommit mode: each statement is its own transaction."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.store.kind == "sqlite":
                conn = sqlite3.connect(self.store.path, isolation_level=None, check_same_thread=False, timeout=30)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            else:
                conn = psycopg.connect(self.store.conninfo, autocommit=True)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _run(self, outputs) -> None:
        conn, m = self._conn(), self.mark
        run_id = conn.execute(f"INSERT INTO run (status, input) VALUES ('running', {m}) RETURNING id",
                              ["{}"]).fetchone()[0]
        for seq, output in enumerate(outputs, 1):
            conn.execute(f"INSERT INTO step (run_id, seq, name, output) VALUES ({m}, {m}, {m}, {m})",
                         [run_id, seq, "tiny", output])
        conn.execute(f"UPDATE run SET status = 'done', output = {m} WHERE id = {m}", ["0", run_id])

    def one_run(self, steps: int, mode: str = "sync") -> None:
        self._run(str(i + 1) for i in range(steps))

    def many_runs(self, runs: int, steps: int, concurrency: int) -> None:
        threaded(lambda _: self.one_run(steps), runs, concurrency)

    def conversation(self, messages: int, base: int = 0) -> None:
        self._run(message(base + i) for i in range(messages))

    def close(self) -> None:
        for conn in self._all:
            conn.close()


def open_system(store: Store) -> Floor:
    return Floor(store)
