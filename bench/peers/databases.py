"""Where each system under test keeps its data: a fresh SQLite file or a fresh PostgreSQL database.

Every (system, database) pair gets its own store, created before and dropped after, so no system
reads another's tables and none starts with a table the previous round filled. The on-disk size of
a store (tables, indexes, TOAST) is measured the same way for every system: the storage workload
reports the growth of that number.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import psycopg

POSTGRES_SERVER = os.environ.get("BENCH_POSTGRES_SERVER", "postgres://postgres@127.0.0.1:5432")


@dataclass(frozen=True)
class Store:
    """One system's database: ``kind`` is "sqlite" or "postgres"; ``url`` is a SQLAlchemy/Django-style URL."""

    kind: str
    url: str
    path: str = ""  # the SQLite file
    name: str = ""  # the PostgreSQL database

    @property
    def conninfo(self) -> str:
        """psycopg's connection string (postgres://...)."""
        return self.url.replace("postgresql://", "postgres://", 1)


def fresh(kind: str, label: str, tmpdir: Path) -> Store:
    """Create an empty store named for ``label`` (dropping any left from an earlier, interrupted run)."""
    if kind == "sqlite":
        path = tmpdir / f"{label}.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return Store("sqlite", f"sqlite:///{path}", path=str(path))
    name = f"peers_{label}"
    with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return Store("postgres", f"postgresql://{POSTGRES_SERVER.split('://', 1)[1]}/{name}", name=name)


def drop(store: Store) -> None:
    if store.kind == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{store.path}{suffix}").unlink(missing_ok=True)
        return
    with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{store.name}" WITH (FORCE)')


def disk_bytes(store: Store) -> int:
    """Bytes of every user table with its indexes (and TOAST on PostgreSQL)."""
    if store.kind == "sqlite":
        conn = sqlite3.connect(store.path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return int(conn.execute("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name NOT LIKE 'sqlite_%'")
                       .fetchone()[0])
        finally:
            conn.close()
    with psycopg.connect(store.conninfo, autocommit=True) as conn:
        return int(conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg_toast%'").fetchone()[0])


def server_cpu_seconds(store: Store) -> float | None:
    """CPU seconds the PostgreSQL server has used so far (the postmaster, every live backend and, through
    the postmaster's reaped-children counters, every backend that has exited), read from /proc; None for
    SQLite (its work is the client's own CPU) or a server this machine does not run.

    The difference over a workload is its server-side CPU, which the client's ``process_time`` cannot
    see: with the client's, it bounds the runs/s that this machine's cores can give."""
    if store.kind != "postgres":
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                name, rest = f.read().rsplit(")", 1)
        except OSError:  # it exited meanwhile: its time is in its parent's reaped counters now
            continue
        if name.endswith("(postgres"):
            stats[int(entry.name)] = rest.split()
    if not stats:
        return None
    total = 0
    for fields in stats.values():  # fields[0] is the state; utime, stime, cutime, cstime are 11-14
        total += int(fields[11]) + int(fields[12])
        if int(fields[1]) not in stats:  # the postmaster: its parent is not a postgres process
            total += int(fields[13]) + int(fields[14])
    return total / ticks
