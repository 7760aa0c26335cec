"""The engine's hot writes straight through libpq: a prepared statement sent with its values as text.

Every sync step of every run appends its record with one statement, and a run's start, its moves
and its settle are one statement each. Through psycopg's cursor each paid, on top of libpq's own
send and receive, the cursor's Python: its query object, the adaptation of each value through the
dumpers, the prepare manager's bookkeeping and the result's wrapping (~25 µs of CPU a step on this
machine, about a tenth of a step's). Here the values are turned into text by a few ``str`` calls,
the statement is prepared once per connection under a name of ours, and psycopg's own wait loop
(the one every psycopg query goes through, so interrupts and a broken connection behave as anywhere
else) reads the answer. Only writes whose caller needs no more than a row count come this way.

Inside a transaction the statement joins it once psycopg has opened it; the first statement of a
transaction goes through psycopg, which sends the BEGIN. Anything this path cannot send exactly as
psycopg would (a value of another type, a naive datetime, text with a NUL, which libpq would cut
short) returns ``None`` before anything is sent, and the caller uses psycopg's cursor, whose errors
are the documented ones. An error from the server is raised as psycopg raises it
(``psycopg.errors``), inside Django's error translation, so the engine sees what it would see
through a cursor: an outage is an ``OperationalError``, a refused row a ``DataError``.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

_NOT_PREPARED = "26000"  # invalid_sql_statement_name: a pooler or DISCARD ALL dropped our statement
PREPARED_MAX = 64  # statements one connection prepares here (the append of an async batch has one per size)
_names: dict[str, tuple[bytes, bytes]] = {}  # SQL with %s placeholders -> (statement name, SQL with $n)


def _statement(sql: str) -> tuple[bytes, bytes] | None:
    known = _names.get(sql)
    if known is None:
        if "%%" in sql:
            return None
        parts = sql.split("%s")
        numbered = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))
        name = "durable_wire_" + hashlib.sha1(sql.encode()).hexdigest()[:20]  # the same in every thread
        known = _names[sql] = (name.encode(), numbered.encode())
    return known


def _text(value: Any) -> bytes | None | bool:
    """A value as PostgreSQL's text input, None for NULL, False when only psycopg may send it."""
    if value is None:
        return None
    if isinstance(value, str):  # a TextChoices member too: its characters are its value
        return False if "\x00" in value else str.encode(value, "utf-8", "strict")
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, uuid.UUID):
        return str(value).encode()
    if isinstance(value, datetime):
        return value.isoformat().encode() if value.utcoffset() is not None else False
    if isinstance(value, Decimal) and value.is_finite():
        return str(value).encode()
    if isinstance(value, timedelta):  # what an interval column takes: days and seconds may differ in sign
        return b"%d days %d seconds %d microseconds" % (value.days, value.seconds, value.microseconds)
    if isinstance(value, _psycopg()[3]):  # a JSONField's value, as Django adapts it for psycopg 3
        text = (value.dumps or json.dumps)(value.obj)
        return _text(text if isinstance(text, str) else bytes(text).decode())
    return False


def execute(conn: Any, sql: str, params: Sequence[Any]) -> int | None:
    """Run ``sql`` (a write, ``%s`` placeholders) on Django's PostgreSQL connection ``conn`` as a prepared
    statement; its row count, or None when it must go through psycopg instead (nothing was sent)."""
    statement = _statement(sql)
    if statement is None:
        return None
    values: list[bytes | None] = []
    try:
        for value in params:
            text = _text(value)
            if text is False:
                return None
            values.append(text)  # type: ignore[arg-type]
    except UnicodeEncodeError:  # a lone surrogate: psycopg refuses it with its own error
        return None
    if conn.connection is None:  # ensure_connection() itself costs an async check a call
        conn.ensure_connection()
    raw = conn.connection
    if not raw.autocommit and raw.pgconn.transaction_status != _psycopg()[2].TransactionStatus.INTRANS:
        return None  # psycopg opens a Django transaction with BEGIN before its first statement: let it
    prepared = getattr(conn, "_durable_wire", None)
    if prepared is None or prepared[0] is not raw.pgconn:  # a new connection prepares its own
        prepared = conn._durable_wire = (raw.pgconn, set())
    if statement[0] not in prepared[1] and len(prepared[1]) >= PREPARED_MAX:
        return None  # an async batch of an unusual size: psycopg's own bounded cache takes it
    started = time.monotonic()
    with conn.wrap_database_errors, raw.lock:
        result = _send(raw, prepared[1], statement, values)
    if conn.queries_logged:
        conn.queries_log.append({"sql": f"{sql} -- libpq, params {list(params)!r}"[:10000],
                                 "time": f"{time.monotonic() - started:.3f}"})
    return result


def _send(raw: Any, prepared: set[bytes], statement: tuple[bytes, bytes], values: list[bytes | None]) -> int:
    errors, generators, pq, _ = _psycopg()
    name, text = statement
    pgconn = raw.pgconn
    for attempt in (1, 2):
        if name not in prepared:
            pgconn.send_prepare(name, text)
            _check(raw, raw.wait(generators.execute(pgconn))[-1], errors, pq)
            prepared.add(name)
        pgconn.send_query_prepared(name, values)
        result = raw.wait(generators.execute(pgconn))[-1]
        if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):  # rows it returns are not read
            return int(result.command_tuples or 0)
        prepared_again = attempt == 1 and pgconn.transaction_status == pq.TransactionStatus.IDLE
        if prepared_again and (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() == _NOT_PREPARED:
            prepared.discard(name)  # dropped behind our back: prepare it again, once (not in a transaction
            continue  # the error has aborted)
        break
    raise errors.error_from_result(result, encoding=raw.info.encoding)


_modules: tuple[Any, Any, Any, Any] | None = None


def _psycopg() -> tuple[Any, Any, Any, Any]:
    """psycopg's errors, generators, pq and Jsonb, imported on the first PostgreSQL write (a SQLite
    process never imports psycopg: journal.store.prepared says what that saves at start-up)."""
    global _modules
    if _modules is None:
        from psycopg import errors, generators, pq
        from psycopg.types.json import Jsonb

        _modules = (errors, generators, pq, Jsonb)
    return _modules


def _check(raw: Any, result: Any, errors: Any, pq: Any) -> None:
    if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        raise errors.error_from_result(result, encoding=raw.info.encoding)
