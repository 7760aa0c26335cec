"""The embedded worker: claims runs, drives them on a thread pool, heartbeats their leases.

``manage.py runworker`` is a thin wrapper around ``EmbeddedWorker``; tests drive the class
directly. A suspended run occupies no thread here: it is a row with a wake-up time.

A database outage (``journal.store.outage``) never stops the worker: the claim loop and the
heartbeat keep trying with exponential backoff (capped at ``MAX_BACKOFF`` seconds), closing their
broken connections; whichever notices first says once that the database went away, and the claim
loop says once that it answers again. A run whose
driving thread gave up during the outage (``DatabaseUnavailable``) has recorded nothing about it;
its lease is expired as soon as the database answers (fenced by the claim's epoch), so any worker
recovers it at once from its journal.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection, connections
from django.utils import timezone

from journal.driver import executor, leases, recovery
from journal.models import Run, Worker
from journal.models.run import lease_seconds
from journal.store import doorbell
from journal.store.errors import DatabaseUnavailable, LeaseLost
from journal.store.outage import OutageLog, drop_connection, is_database_outage
from journal.store.thread_connections import close_at_thread_exit

log = logging.getLogger(__name__)
OUTCOMES_KEPT = 1000
MAX_BACKOFF = 5.0  # seconds between two polls of a database that does not answer
HOUSEKEEPING: list[Callable[[], object]] = []  # a seam: jobs every embedded worker runs now and then


def add_housekeeping(job: Callable[[], object]) -> None:
    if job not in HOUSEKEEPING:
        HOUSEKEEPING.append(job)


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class EmbeddedWorker:
    def __init__(self, concurrency: int = 4, *, poll_interval: float = 0.2, ttl: int | None = None,
                 worker_id: str | None = None, kind: str = "embedded"):
        self.concurrency = max(1, concurrency)
        self.poll_interval = poll_interval
        self.ttl = ttl or lease_seconds()
        self.id = worker_id or make_worker_id()
        self.kind = kind
        self.stopping = threading.Event()
        # Set when a run ends (a slot is free) or a stop is asked: the loop claims again at once
        # rather than after a poll interval (at concurrency 1, a sleep after every run).
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="durable-run")
        self._active: dict = {}  # run_id -> Claim
        self._contexts: dict = {}  # run_id -> Context, while a thread drives it
        self._lock = threading.Lock()
        self._heartbeat_thread: threading.Thread | None = None
        self._bell_thread: threading.Thread | None = None  # LISTENs for runnable runs (PostgreSQL)
        self.completed = 0
        self.outcomes: OrderedDict[str, str] = OrderedDict()  # the latest runs' statuses, bounded
        self.maintenance_interval = float(getattr(settings, "DURABLE_RETENTION_INTERVAL", 3600))
        self.db = OutageLog(log, f"worker {self.id}")
        self._given_back: dict = {}  # run_id -> epoch: given up during an outage, to expire when it answers
        self._drivers: set[int] = set()  # pool threads that drove a run (and keep a connection open)

    # -- lifecycle ----------------------------------------------------------------------
    def register(self) -> None:
        """Say this worker is alive, then take over the runs of this host's workers that died (at once,
        not after their leases expire: journal.driver.recovery)."""
        Worker.objects.update_or_create(id=self.id, defaults={
            "kind": self.kind, "hostname": socket.gethostname(), "pid": os.getpid(), "started_at": timezone.now(),
            "concurrency": self.concurrency, "heartbeat_at": timezone.now(), "stopped_at": None})
        recovery.take_over_dead_local_workers(self.id)

    def run(self, *, until_idle: bool = False, max_seconds: float | None = None) -> int:
        """Loop until stopped (or idle); returns the number of runs driven to a stop."""
        deadline = time.monotonic() + max_seconds if max_seconds else None
        if not self._wait_for_database(self.register, deadline):
            return self.completed
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="durable-heartbeat", daemon=True)
        self._heartbeat_thread.start()
        doorbell.listen(self._wake.set)  # a run started or woken in this process is claimed at once
        if doorbell.database_bell() and not until_idle:  # ... on PostgreSQL, one made runnable in any process
            self._bell_thread = threading.Thread(target=doorbell.listen_database, args=(self._wake.set, self.stopping),
                                                 name="durable-bell", daemon=True)
            self._bell_thread.start()
        next_maintenance = time.monotonic() + 5.0
        delay = self.poll_interval
        idle_once = False
        try:
            while not self.stopping.is_set():
                if deadline and time.monotonic() > deadline:
                    break
                try:
                    if not until_idle and time.monotonic() >= next_maintenance:
                        self.maintenance()
                        next_maintenance = time.monotonic() + self.maintenance_interval
                    # A run that ends during the claim can wake another (a child wakes its parent): idle
                    # only if nothing was in flight before the claim looked.
                    busy = bool(self._active)
                    claimed = self.tick()
                except Exception as exc:
                    if not is_database_outage(exc):
                        raise
                    self._database_failed(exc)  # keep polling, slower and slower, until it answers
                    self.stopping.wait(delay)
                    delay = min(max(delay, 0.05) * 2, MAX_BACKOFF)
                    continue
                delay = self.poll_interval
                if until_idle and claimed == 0 and not busy and not self._active:
                    # Idle twice, a full poll interval apart: a run that has just suspended on a short
                    # timer woke this loop at once, and its timer may be due before the next poll.
                    if idle_once:
                        break
                    idle_once = True
                    self.stopping.wait(self.poll_interval)
                    continue
                idle_once = False
                if claimed == 0:
                    self._wake.wait(self.poll_interval)
                    self._wake.clear()
        finally:
            self.shutdown()
        return self.completed

    def _database_failed(self, exc: BaseException) -> None:
        self.db.failed(exc)  # one log line per outage
        drop_connection()

    def _wait_for_database(self, call: Callable[[], object], deadline: float | None = None) -> bool:
        """Call until the database answers (False when stopped or past the deadline first)."""
        delay = self.poll_interval
        while not self.stopping.is_set() and not (deadline and time.monotonic() > deadline):
            try:
                call()
            except Exception as exc:
                if not is_database_outage(exc):
                    raise
                self._database_failed(exc)
                self.stopping.wait(delay)
                delay = min(max(delay, 0.05) * 2, MAX_BACKOFF)
                continue
            self.db.answered()
            return True
        return False

    def _return_given_back(self) -> None:
        """The database answers again: expire the leases of the runs given up during the outage."""
        with self._lock:
            held = dict(self._given_back)
        if not held:
            return
        returned = leases.give_back(self.id, held, ttl=self.ttl)
        with self._lock:
            for run_id in held:
                self._given_back.pop(run_id, None)
        log.info("worker %s: %d run(s) given back during the outage are claimable again", self.id, returned)

    def maintenance(self) -> None:
        """Housekeeping no run is waiting for (retention purges on the admins' schedule, registered
        by the app at start-up: the driver does not import the operations floor)."""
        for job in list(HOUSEKEEPING):
            try:
                job()
            except Exception:
                log.exception("worker %s: housekeeping %s failed", self.id, getattr(job, "__qualname__", job))

    def tick(self) -> int:
        _reuse_connections()
        self._return_given_back()
        with self._lock:
            free = self.concurrency - len(self._active)
        if free <= 0:
            if self.db.down:  # every slot busy: ask the database anyway, to know when it is back
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                self.db.answered()
            return 0
        claims = leases.claim(self.id, free, ttl=self.ttl)
        self.db.answered()  # only a query that went through says so (a busy worker's tick asks nothing)
        for claim in claims:
            with self._lock:
                self._active[claim.run_id] = claim
            self._pool.submit(self._drive_pooled, claim)
        return len(claims)

    def drive_one(self, run_id) -> str | None:
        """Claim and drive one specific run in this thread (the Celery task path).

        Returns "unavailable" when the database went away while driving (the run was given back);
        a database outage while claiming raises (the task retries)."""
        self._return_given_back()
        claims = leases.claim(self.id, 1, run_id=run_id, ttl=self.ttl)
        self.db.answered()
        if not claims:
            return None
        with self._lock:
            self._active[claims[0].run_id] = claims[0]
        return self._drive(claims[0])

    def _drive_pooled(self, claim) -> str:
        with self._lock:
            self._drivers.add(threading.get_ident())
        close_at_thread_exit()  # a pool shut down while a run is driven ends its idle threads unasked
        return self._drive(claim)

    def _drive(self, claim) -> str:
        status = "error"
        try:
            _reuse_connections()
            status = executor.drive(claim, self.id, on_context=lambda ctx: self._set_context(claim.run_id, ctx))
            return status
        except LeaseLost:
            status = "lost"
            return status
        except DatabaseUnavailable as exc:
            # Nothing was recorded: the run is still running under this claim. Its lease is expired when
            # the database answers (or runs out); the epoch fences anything this claim might still try.
            status = "unavailable"
            self.db.failed(exc)
            with self._lock:
                self._given_back[claim.run_id] = claim.epoch
            log.info("worker %s: run %s given back, not failed: %s", self.id, claim.run_id, exc)
            return status
        except Exception:
            log.exception("worker %s: driving run %s failed", self.id, claim.run_id)
            return status
        finally:
            with self._lock:
                self._active.pop(claim.run_id, None)
                self.completed += 1
                self.outcomes[str(claim.run_id)] = status
                while len(self.outcomes) > OUTCOMES_KEPT:  # a long-lived worker must not grow with history
                    self.outcomes.popitem(last=False)
            if self.stopping.is_set():
                _close_all()
            doorbell.stopped(claim.run_id)  # journal.wait in this process reads the row now
            self._wake.set()

    def _close_pool_connections(self, timeout: float = 5.0) -> None:
        """Close the connections the pool's threads kept between runs, each in its own thread (a Django
        connection belongs to the thread that opened it): one task per thread that drove a run, held
        at a barrier so that no thread takes two."""
        with self._lock:
            threads = len(self._drivers)
            self._drivers.clear()
        if not threads:
            return
        barrier = threading.Barrier(threads, timeout=timeout)

        def close_mine() -> None:
            _close_all()
            try:
                barrier.wait()
            except threading.BrokenBarrierError:  # a thread still busy: its connection closes with it
                pass

        for future in [self._pool.submit(close_mine) for _ in range(threads)]:
            future.result()

    def _set_context(self, run_id, ctx) -> None:
        with self._lock:
            if ctx is None:
                self._contexts.pop(run_id, None)
            else:
                self._contexts[run_id] = ctx
                if self.stopping.is_set():
                    ctx.interrupt = "release"

    # -- heartbeats ---------------------------------------------------------------------
    def heartbeat(self) -> None:
        with self._lock:
            held = {rid: c.epoch for rid, c in self._active.items()}
            contexts = dict(self._contexts)
        flags = leases.renew(self.id, held, ttl=self.ttl)
        for rid, ctx in contexts.items():
            flag = flags.get(rid)
            if flag is None:
                ctx.writer.lost = LeaseLost(f"run {rid} lease lost")
                continue
            if flag["cancel"]:
                ctx.interrupt, ctx.interrupt_reason = "cancel", flag["reason"]
            elif flag["paused"]:
                ctx.interrupt = "pause"
            if ctx.progress_dirty:
                Run.objects.filter(id=rid, epoch=ctx.epoch).update(progress=ctx.progress, steps=ctx.position)
        Worker.objects.filter(id=self.id).update(heartbeat_at=timezone.now())

    def _heartbeat_loop(self) -> None:
        interval = max(self.ttl / 3.0, 0.2)
        try:
            while not self.stopping.wait(interval):
                try:
                    self.heartbeat()  # recovery is the claim loop's to announce (one line per outage)
                except Exception as exc:
                    if is_database_outage(exc):  # leases are kept as they are; said once per outage
                        self._database_failed(exc)
                    else:
                        log.exception("worker %s: heartbeat failed", self.id)
                finally:
                    close_old_connections()
        finally:
            _close_all()

    def request_stop(self) -> None:
        """SIGTERM: stop claiming; running workflows give their runs back at the next step boundary."""
        self.stopping.set()
        doorbell.unlisten(self._wake.set)
        self._wake.set()
        with self._lock:
            for ctx in self._contexts.values():
                ctx.interrupt = ctx.interrupt or "release"

    def shutdown(self, grace: float = 20.0) -> None:
        self.request_stop()
        end = time.monotonic() + grace
        while self._active and time.monotonic() < end:
            try:
                self.heartbeat()
            except Exception as exc:
                if is_database_outage(exc):
                    self._database_failed(exc)
                else:
                    log.exception("heartbeat during shutdown failed")
            time.sleep(0.1)
        if not self._active:
            self._close_pool_connections()
        self._pool.shutdown(wait=not self._active, cancel_futures=True)
        if self._bell_thread is not None:
            self._bell_thread.join(timeout=5)  # it looks at `stopping` five times a second
        try:
            self._return_given_back()
            if self._active:  # stuck in a long step: let another worker take over at once
                leases.expire_worker(self.id)
            Worker.objects.filter(id=self.id).update(stopped_at=timezone.now(),
                                                     heartbeat_at=timezone.now() - timedelta(seconds=0))
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            self._database_failed(exc)  # its leases run out by themselves
        close_old_connections()


IDLE_CHECK = 10.0  # seconds: a connection unused this long is asked whether it still works before a run
_last_used = threading.local()


def _reuse_connections() -> None:
    """Keep this thread's connections from one run (or claim) to the next. Django's
    close_old_connections closes them each time when CONN_MAX_AGE is 0 (its default), and opening one
    cost more than a short run: ~15 ms per run on PostgreSQL, ~6 ms on SQLite (its pragmas and WAL).
    A connection is closed here only when an error left it unusable, or when it sat idle a while and
    no longer answers (a server restarted meanwhile); the next query then opens a new one."""
    now = time.monotonic()
    idle = now - getattr(_last_used, "at", now)
    _last_used.at = now
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        if conn.errors_occurred or idle > IDLE_CHECK:
            if conn.is_usable():
                conn.errors_occurred = False
                continue
            try:
                conn.close()
            except Exception:  # closing a connection to a dead server may complain; it is closed either way
                conn.connection = None


def _close_all() -> None:
    try:
        connections.close_all()
    except Exception as exc:  # a connection to a server that went away
        if not is_database_outage(exc):
            raise
