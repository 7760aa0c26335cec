"""The doorbells: tell whoever drives runs that one became runnable, and whoever waits that one stopped.

**Runnable.** ``notify(run_id)`` rings, once the transaction commits, every embedded worker of this
process (``listen``: its claim loop claims at once instead of at its next poll, so a run started or
resumed from a page or a script in the same process starts within a millisecond rather than up to
a poll interval later) and the installed backend: with ``DURABLE_CELERY`` on, the Celery
integration plugs in one at start-up (``journal.integrations.tasks``) that sends a message carrying
only the run id. A worker that hears the bell still has to win the database lease, so a bell that
rings twice, or for a run someone else took, is harmless. A worker in another process does not hear
this process's bell and finds the run at its next poll.

**Stopped.** ``stopped(run_id)`` is rung by a worker of this process when a drive of the run ends;
``watch(run_id)`` is what ``journal.wait`` listens with, so that waiting for a run driven here costs
one query after it stops, not a poll loop. The database stays the only authority: a waiter reads the
run's row after every bell and keeps polling (more slowly) for runs driven elsewhere.

A seam, so the store never imports the floors that drive runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import transaction

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


def notify(run_id) -> None:
    """A run became runnable: ring once the caller's transaction commits (at once outside one)."""
    backend = _backend
    if backend is None and not _listeners:
        return
    run_id = str(run_id)
    transaction.on_commit(lambda: _ring(backend, run_id))


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
