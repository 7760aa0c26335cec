"""Group commit: concurrent runs in one process share a journal commit.

A sync step is durable only once its record has committed, and a commit costs an fsync (SQLite) or a
WAL flush and a round trip (PostgreSQL). Eight runs driven by eight threads would pay eight of them
for eight steps that arrived together. Here the first writer to arrive writes at once, alone, exactly
as before: a run with no company pays nothing for the grouping. Writers that arrive while a commit is
in flight queue up; when it ends, the first of them leads the next commit, writing every queued
record at once, and each waiting thread returns only when its own record is durable.

Each record keeps its own fence (its run's epoch), so a zombie's record inserts nothing and only that
writer hears ``LeaseLost``; the others commit. Any other error inside a shared write would fail it
for all, so the group then falls back to one commit per writer, and each hears only its own answer.
A database outage is every writer's: each retries through its own backoff and finds out by its own
sequence numbers whether a commit that failed at the last moment went through.

The queue knows nothing of what it writes: the journal writer gives it ``write_one`` (one writer's
rows, committed on their own) and ``write_many`` (several writers' rows in one commit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import connection

from journal.store import outage

WriteOne = Callable[[Any], None]
# Writes every item in one commit; returns {index: error} for the items their own fence refused.
WriteMany = Callable[[Sequence[Any]], dict[int, BaseException]]


class _Request:
    __slots__ = ("item", "done", "error", "lead", "group")

    def __init__(self, item: Any):
        self.item = item
        self.done: threading.Event | None = None  # made only for a request that queues: a leader never waits
        self.error: BaseException | None = None
        self.lead = False  # woken to lead the next commit, not because its own one ended
        self.group: list[_Request] = []


class GroupCommit:
    """One database's commit queue in this process."""

    def __init__(self, write_one: WriteOne, write_many: WriteMany):
        self._write_one = write_one
        self._write_many = write_many
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._busy = False  # a commit is in flight: arrivals queue for the next one
        self.commits = 0  # commits made (benchmarks and tests read them)
        self.shared = 0  # items that shared their commit with another

    def submit(self, item: Any) -> None:
        """Make ``item`` durable, alone or with whoever else is waiting; raise what concerns it alone."""
        request = _Request(item)
        with self._lock:
            if self._busy:
                request.done = threading.Event()
                self._queue.append(request)
            else:
                self._busy = True
                request.lead, request.group = True, [request]
        if request.done is not None:
            request.done.wait()
        if request.lead:
            self._lead(request)
        if request.error is not None:
            raise request.error

    def _lead(self, leader: _Request) -> None:
        group = leader.group
        try:
            self._commit(group)
        finally:
            with self._lock:
                waiting, self._queue = self._queue, []
                if waiting:
                    waiting[0].lead, waiting[0].group = True, waiting
                else:
                    self._busy = False
            for request in group:
                if request is not leader:
                    request.lead = False
                    request.done.set()
            if waiting:
                waiting[0].done.set()

    def _commit(self, group: list[_Request]) -> None:
        if len(group) == 1:
            self._alone(group[0])
            return
        try:
            refused = self._write_many([r.item for r in group])
        except Exception as exc:
            if outage.is_database_outage(exc):
                for request in group:
                    request.error = exc
                return
            for request in group:  # one writer's bad row must not fail the others: each commits alone
                self._alone(request)
            return
        except BaseException as exc:
            for request in group:
                request.error = exc
            raise
        self.commits += 1
        self.shared += len(group) - len(refused)
        for i, exc in refused.items():
            group[i].error = exc

    def _alone(self, request: _Request) -> None:
        try:
            self._write_one(request.item)
            self.commits += 1
        except BaseException as exc:
            request.error = exc


def enabled(conn: Any = connection) -> bool:
    """``DURABLE_GROUP_COMMIT``, or by default on for SQLite and off for PostgreSQL; never inside the
    caller's own transaction (an atomic step's record must commit with the step's writes, on its connection).

    PostgreSQL flushes the WAL of concurrent commits together by itself, so a queue in the client only
    serializes writers that the server would have overlapped: 200 ten-step runs on 8 threads went
    186 runs/s with the queue and 214 without (median of 6 interleaved rounds). SQLite takes one writer
    at a time; its queue is what lets eight runs share one fsync where a disk's fsync is slow."""
    if conn.in_atomic_block:
        return False
    chosen = getattr(settings, "DURABLE_GROUP_COMMIT", None)
    return conn.vendor == "sqlite" if chosen is None else bool(chosen)
