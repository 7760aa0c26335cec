"""The integer key of the tables the engine appends to on every step (session events, trace spans,
checkpoints, a run's step names).

On SQLite Django declares such a key ``AUTOINCREMENT``, which keeps a counter per table in
``sqlite_sequence`` so that a key is never handed out twice, even after the newest row is deleted.
Every transaction that inserts into such a table rewrites that counter's page: one more 4 KiB page in
the write-ahead log, to checksum, write, fsync and later copy back, for each sync step's commit. A
plain ``INTEGER PRIMARY KEY`` takes the largest key in use plus one, so keys still grow with every
insert among the rows that exist; only a key whose row was deleted (retention of the newest rows)
may be given again, and nothing here refers to a deleted row's key. Measured on this machine: an
autocommitted append of a session event cost 88 µs of CPU with the counter and 75 µs without
(1,100 appends a round, median of 3 rounds, sqlite3 alone), and a ten-step run wrote 84 pages to the
log with it and 73 without (migration 0011). PostgreSQL keeps its identity column.
"""

from __future__ import annotations

from django.db import models


class AppendKey(models.BigAutoField):
    def db_type_suffix(self, connection):
        if connection.vendor == "sqlite":
            return None  # INTEGER PRIMARY KEY: the rowid, without the sqlite_sequence counter
        return super().db_type_suffix(connection)
