"""The doorbells: tell whoever drives runs that one became runnable, and whoever waits that one stopped.

**Runnable.** ``notify(run_id)`` rings, once the transaction commits, every embedded worker of this
process (``listen``: its claim loop claims at once instead of at its next poll, so a run started or
resumed from a page or a script in the same process starts within a millisecond rather than up to
a poll interval later) and the installed backend: with ``DURABLE_CELERY`` on, the Celery
integration plugs in one at start-up (``journal.integrations.tasks``) that sends a message carrying
only the run id. A worker that hears the bell still has to win the database lease, so a bell that
rings twice, or for a run someone else took, is harmless. A worker in another process does not hear
this process's bell and finds the run at its next poll, except on PostgreSQL: there the bell is
also a ``NOTIFY durable_runnable`` sent with the transaction (delivered when it commits, dropped if
it rolls back; a run's start carries it in its one statement), and every embedded worker LISTENs on
its own connection (``listen_database``). ``DURABLE_PG_NOTIFY = False`` turns that off: NOTIFY
serialises the commits that send it, which only a site starting thousands of runs a second feels.

**Stopped.** ``stopped(run_id)`` is rung by a worker of this process when a drive of the run ends;
``watch(run_id)`` is what ``journal.wait`` listens with, so that waiting for a run driven here costs
one query after it stops, not a poll loop. The database stays the only authority: a waiter reads the
run's row after every bell and keeps polling (more slowly) for runs driven elsewhere.

A seam, so the store never imports the floors that drive runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction

log = logging.getLogger(__name__)
CHANNEL = "durable_runnable"

_backend: Callable[[str], None] | None = None
_listeners: list[Callable[[], None]] = []  # this process's embedded workers: each one's "claim now"
_watchers: dict[str, list[threading.Event]] = {}  # run id -> the events of those waiting for it here
_lock = threading.Lock()


def set_backend(backend: Callable[[str], None] | None) -> None:
    """Install (or remove, with None) what ``notify`` calls after commit with the run id."""
    global _backend
    _backend = backend


def listen(wake: Callable[[], None]) -> None:
    """Call ``wake`` (it must be quick and never raise: an Event's ``set``) whenever a run becomes runnable here."""
    with _lock:
        if wake not in _listeners:
            _listeners.append(wake)


def unlisten(wake: Callable[[], None]) -> None:
    with _lock:
        if wake in _listeners:
            _listeners.remove(wake)


def database_bell() -> bool:
    """Whether runnable runs are announced through the database (PostgreSQL's NOTIFY)."""
    return connection.vendor == "postgresql" and bool(getattr(settings, "DURABLE_PG_NOTIFY", True))


def notify(run_id, *, sent: bool = False) -> None:
    """A run became runnable: ring once the caller's transaction commits (at once outside one).

    ``sent``: the caller's statement carried the database's NOTIFY already (a run's start)."""
    run_id = str(run_id)
    if not sent and database_bell():
        _send(run_id)
    backend = _backend
    if backend is None and not _listeners:
        return
    transaction.on_commit(lambda: _ring(backend, run_id))


def _send(run_id: str) -> None:
    """The NOTIFY, in the caller's transaction (sent if it commits). Outside one the change it announces
    has committed already: a bell that cannot be sent then must not turn a done action into an error
    (the workers' poll finds the run anyway)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, run_id])
    except DatabaseError as exc:
        if connection.in_atomic_block:
            raise  # the caller's transaction is broken: its change is not made either
        log.info("doorbell: could not announce run %s (%s); the workers' poll will find it", run_id,
                 type(exc).__name__)


def _ring(backend: Callable[[str], None] | None, run_id: str) -> None:
    for wake in list(_listeners):
        wake()
    if backend is not None:
        backend(run_id)


def stopped(run_id) -> None:
    """A drive of ``run_id`` ended in this process: wake whoever waits for it here to read its row again."""
    if not _watchers:
        return
    with _lock:
        events = list(_watchers.get(str(run_id), ()))
    for event in events:
        event.set()


@contextmanager
def watch(run_id) -> Iterator[threading.Event]:
    """An event set when a drive of ``run_id`` ends in this process. Watch *before* reading the row:
    a drive that ends between the read and the wait has then already set it."""
    key, event = str(run_id), threading.Event()
    with _lock:
        _watchers.setdefault(key, []).append(event)
    try:
        yield event
    finally:
        with _lock:
            waiting = _watchers.get(key, [])
            if event in waiting:
                waiting.remove(event)
            if not waiting:
                _watchers.pop(key, None)


def listen_database(wake: Callable[[], None], stopping: threading.Event, *, every: float = 0.2) -> None:
    """LISTEN for runnable runs on a connection of its own and call ``wake`` for each (PostgreSQL).

    Runs until ``stopping`` is set, looking at it every ``every`` seconds. A connection that fails
    is opened again after a pause that doubles up to 5 s; meanwhile the worker's poll finds the runs,
    as it always does for a bell missed."""
    import psycopg  # only a PostgreSQL worker listens: a SQLite process never imports it

    params = {"connect_timeout": 5, **connections["default"].get_connection_params()}
    delay = every
    while not stopping.is_set():
        try:
            with psycopg.connect(**params, autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                delay = every
                wake()  # a bell rung while this connection was not listening
                while not stopping.is_set():
                    for _note in conn.notifies(timeout=every):
                        wake()
        except Exception as exc:  # an outage or a refused connection: poll, and listen again later
            if stopping.is_set():
                return
            log.debug("doorbell: listening failed (%s: %s); retrying in %.1f s", type(exc).__name__, exc, delay)
            stopping.wait(delay)
            delay = min(delay * 2, 5.0)
