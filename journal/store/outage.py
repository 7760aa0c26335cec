"""The engine's own database faults: which errors they are, whose they are, and how the engine waits them out.

**Which errors.** A database *outage* is an error that says the connection or the server went away or
cannot serve now, not that the statement or its data was wrong: Django's ``OperationalError`` and
``InterfaceError`` (PostgreSQL's "the database system is starting up", "terminating connection due to
administrator command", "server closed the connection unexpectedly", a refused connection; SQLite's
"database is locked"), and any other ``DatabaseError`` whose driver error carries an SQLSTATE of class
08 (connection exception), 53 (insufficient resources), 57P (operator intervention) or 58 (system
error). ``DataError``, ``IntegrityError``, ``ProgrammingError`` and ``NotSupportedError`` are never
outages: bad data or bad SQL does not get better by waiting.

**Whose they are: decided by where the exception came from, not by its type alone.**

- An outage raised by the engine's own calls is the engine's: recording a journal entry, claiming,
  heartbeating, renewing leases, settling, and the reads and writes a primitive makes for the workflow
  (a step's or effect's record and ledger row, a wait's signal lookup, a child's row, a model call's
  record). Writes are retried in the writer with bounded exponential backoff; when the outage outlasts
  ``DURABLE_DB_RETRY_SECONDS`` the engine raises :class:`DatabaseUnavailable`, a ``BaseException``
  (workflow code that catches ``Exception`` cannot swallow it), and the driving thread gives the run
  back without recording anything: the run stays ``running`` under its lease, which the worker expires
  as soon as the database answers again (fenced by the claim's epoch), or which simply runs out.
- An exception raised inside code the workflow supplies is the workflow's, whatever its type: a step's
  or effect's function body (retried per the step's ``retries``, then failing the step), a reconcile
  function, a model client, a tool, a compensation, and the workflow function's own body when it talks
  to a database itself. :func:`workflow_code` marks such exceptions on their way out, and
  :func:`engine_call` (around every primitive a workflow calls) converts only unmarked outages.

So a user's step that queries some database and gets ``OperationalError`` fails that step like any
other error; the same ``OperationalError`` raised while the engine records that step's result gives the
run back and the step's record is written when the database returns.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    connection,
)

from journal.store.errors import DatabaseUnavailable

_NOT_OUTAGES = (DataError, IntegrityError, ProgrammingError, NotSupportedError)
_OUTAGE_SQLSTATE_PREFIXES = ("08", "53", "57P", "58")
_MARK = "_durable_workflow_error"


def is_database_outage(exc: BaseException) -> bool:
    """True for an error that means the database connection or server went away (see the module docstring)."""
    if isinstance(exc, OperationalError | InterfaceError):  # InterfaceError is not a DatabaseError
        return True
    if not isinstance(exc, DatabaseError) or isinstance(exc, _NOT_OUTAGES):
        return False
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None) or ""
    return isinstance(state, str) and state.startswith(_OUTAGE_SQLSTATE_PREFIXES)


def retry_seconds() -> float:
    """How long the engine retries one write before it gives the run back (``DURABLE_DB_RETRY_SECONDS``)."""
    try:
        return max(0.0, float(os.environ.get("DURABLE_DB_RETRY_SECONDS", "30")))
    except ValueError:
        return 30.0


def backoff(budget: float, first: float = 0.05, cap: float = 2.0) -> Iterator[float]:
    """Exponential delays with jitter (first, 2*first, ... capped at ``cap``) until ``budget`` seconds are spent."""
    spent = 0.0
    delay = first
    while spent < budget:
        step = min(delay * random.uniform(0.75, 1.25), cap, budget - spent)
        spent += step
        yield step
        delay = min(delay * 2, cap)


def drop_connection() -> None:
    """Close this thread's database connection (broken by the outage); the next query reconnects."""
    try:
        connection.close()
    except Exception:  # closing a connection to a dead server may complain; it is closed either way
        connection.connection = None


# -- whose exception ---------------------------------------------------------------------------------------

def from_workflow(exc: BaseException) -> bool:
    return bool(getattr(exc, _MARK, False))


@contextmanager
def workflow_code() -> Iterator[None]:
    """Around a call into code the workflow supplies: whatever it raises is the workflow's."""
    try:
        yield
    except Exception as exc:
        try:
            setattr(exc, _MARK, True)
        except (AttributeError, TypeError):  # an exception type with __slots__: treated as the engine's
            pass
        raise


def engine_outage(exc: BaseException) -> bool:
    """An outage the engine's own calls raised (not marked as coming from workflow code)."""
    return is_database_outage(exc) and not from_workflow(exc)


def unavailable(exc: BaseException, doing: str = "") -> DatabaseUnavailable:
    what = f" while {doing}" if doing else ""
    return DatabaseUnavailable(f"the database is unavailable{what}: {type(exc).__name__}: {exc}".strip())


def engine_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate an engine primitive a workflow calls: an outage of the engine's own queries inside it becomes
    DatabaseUnavailable, which workflow code cannot catch as an ``Exception``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if engine_outage(exc):
                raise unavailable(exc, getattr(fn, "__name__", "")) from exc
            raise

    return wrapper


# -- waiting an outage out -----------------------------------------------------------------------------------

class OutageLog:
    """Says once that the database went away and once that it answers again, however many polls fail between."""

    def __init__(self, logger: logging.Logger, who: str):
        self.logger = logger
        self.who = who
        self.since: float | None = None
        self.outages = 0  # how many distinct outages this process saw
        self.last_downtime = 0.0  # seconds the latest outage lasted, as this process saw it
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> bool:
        """Note a failure; True (and one log line) only for the first failure of an outage."""
        with self._lock:
            if self.since is not None:
                return False
            self.since = time.monotonic()
            self.outages += 1
        root = exc.__cause__ if isinstance(exc, DatabaseUnavailable) and exc.__cause__ else exc
        self.logger.warning("%s: the database is unavailable (%s: %s); runs in flight wait for it or are "
                            "given back, never failed; retrying until it answers", self.who, type(root).__name__,
                            str(root).strip()[:300])
        return True

    def answered(self) -> None:
        with self._lock:
            if self.since is None:
                return
            self.last_downtime = time.monotonic() - self.since
            self.since = None
        self.logger.warning("%s: the database answers again (unavailable for %.1fs)", self.who, self.last_downtime)
