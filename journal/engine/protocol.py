"""The replay protocol: look up (run, position); if recorded, return the record; else execute and record.

This is the whole of deterministic replay, written once: every primitive (steps, effects, waits,
approvals, children, model calls, sandbox commands, now/random/uuid4) starts with ``begin`` or
goes through ``journaled``. A workflow re-runs from the top on every resume;
each journaled call takes the next position, and a position that was recorded returns its
record without executing. A record whose step name or arguments differ from the call is
non-determinism, reported and never papered over.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from journal.engine.registry import StepDef
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.store.blobs import INLINE_LIMIT, load_json, store_json
from journal.store.errors import NondeterminismError, StepError
from journal.store.serialization import encode, exception_text, storable, storable_text

MAX_ARGS_IN_RECORD = 20_000  # bytes of arguments kept in the record for people to read

# Span ids need to be unique, not secret: a generator of the engine's own (workflow code that seeds the
# random module cannot make them repeat), seeded anew in a forked child, instead of a system call a step.
_span_ids = random.Random()
os.register_at_fork(after_in_child=_span_ids.seed)


class ReplayExhausted(BaseException):  # noqa: N818
    """Internal: a replay-only execution reached a position the journal never recorded."""

    def __init__(self, position: int, step_name: str):
        self.position = position
        self.step_name = step_name
        super().__init__(position, step_name)


def verify(ctx, position: int, record: dict, step_name: str, args_hash: str | None) -> None:
    if record["step_name"] != step_name:
        raise NondeterminismError(position, record["step_name"], step_name, "a different call")
    recorded_hash = record["payload"].get("args_hash")
    if args_hash is not None and recorded_hash is not None and recorded_hash != args_hash:
        raise NondeterminismError(position, f"{step_name}(args {recorded_hash})", f"{step_name}(args {args_hash})",
                                  "same step, different arguments")


def recorded_result(record: dict) -> Any:
    payload = record["payload"]
    if "error" in payload:
        err = payload["error"]
        raise StepError(
            record["step_name"], err.get("type", "Error"), err.get("message", ""), payload.get("attempt", 1)
        )
    return result_of(payload)


def result_of(payload: dict) -> Any:
    """The one reader of a recorded result: inline in the record, or in the blob store when large."""
    if "result_ref" in payload:
        return load_json(payload["result_ref"])
    return payload.get("result")


def lookup(ctx, position: int, step_name: str, args_hash: str | None = None) -> dict | None:
    record = ctx.recorded.get(position)
    if record is None:
        if ctx.replay_only:
            raise ReplayExhausted(position, step_name)
        return None
    verify(ctx, position, record, step_name, args_hash)
    return record


def begin(ctx, step_name: str, args_hash: str | None = None) -> tuple[int, dict | None]:
    """The first half of every journaled call: a cooperative stop point, the next position, and its
    record if the journal has one (verified against this call: NondeterminismError otherwise)."""
    ctx.check_interrupts()
    position = ctx.next_position()
    return position, lookup(ctx, position, step_name, args_hash)


def journaled(ctx, step_name: str, execute: Callable[[int], Any], *, args_hash: str | None = None,
              replayed: Callable[[dict], Any] = recorded_result) -> Any:
    """Look up; else execute and record. ``execute(position)`` runs the call and records it."""
    position, record = begin(ctx, step_name, args_hash)
    if record is not None:
        return replayed(record)
    return execute(position)


def record_value(ctx, name: str, produce: Callable[[], Any]) -> Any:
    """now/random/uuid4: recorded lazily (with the next durable write): nothing durable can
    depend on the value before that write, so losing it in a crash is harmless."""
    def execute(position: int) -> Any:
        value = storable(produce(), what=f"the value of {name}")  # live and replay see the same, storable value
        ctx.writer.record(EventKind.STEP_COMPLETED, {"result": value, "kind": name}, position=position,
                          step_name=name, durability="exit")
        return value

    return journaled(ctx, name, execute, replayed=lambda record: record["payload"]["result"])


def result_payload(result_json: Any) -> dict:
    """Large results go to the blob store; the journal row keeps a reference (storage O(n))."""
    text_len = len(str(result_json)) if result_json is not None else 0
    if text_len > INLINE_LIMIT:
        return {"result_ref": store_json(result_json)}
    return {"result": result_json}


def span(ctx, name: str, kind: str, position: int | None, started, duration_ms: float, *, status: str = "ok",
         error: str = "", attempt: int = 1, **fields: Any) -> None:
    ctx.writer.add_span({
        "span_id": f"{_span_ids.getrandbits(64):016x}", "parent_span_id": "", "name": name, "kind": kind,
        "position": position, "attempt": attempt, "status": status, "error": storable_text(error)[:2000],
        "started_at": started, "ended_at": started + timedelta(milliseconds=duration_ms),
        "duration_ms": duration_ms, **fields,
    })


def call_with_retries(ctx, defn: StepDef, position: int, call: dict, extra_kwargs: dict | None = None, *,
                      span_kind: str | None = None, span_fields: dict | None = None):
    """Run the function, retrying with backoff; returns (result_json, attempt, started, ms) or raises StepError.

    Every attempt that raises gets a span and a ``step_failed`` event; the caller records the outcome.
    """
    span_kind = span_kind or (SpanKind.EFFECT if defn.effect else SpanKind.STEP)
    attempt = 0
    while True:
        attempt += 1
        started = datetime.now(UTC)  # timezone.now(), without its read of settings.USE_TZ (always on here)
        t0 = time.perf_counter()
        ctx.in_step = True
        try:
            result = defn.fn(*call["args"], **call["kwargs"], **(extra_kwargs or {}))
        except Exception as exc:
            ms = (time.perf_counter() - t0) * 1000
            error_type, message = exception_text(exc)  # a lone surrogate or NUL is escaped, never a failed write
            error = {"type": error_type, "message": message[:4000]}
            span(ctx, defn.name, span_kind, position, started, ms, status="error",
                 error=f"{error['type']}: {error['message']}", attempt=attempt, **(span_fields or {}))
            ctx.writer.record(EventKind.STEP_FAILED, {"error": error, "attempt": attempt,
                              "will_retry": attempt <= defn.retries}, step_name=defn.name, durability="exit")
            if attempt <= defn.retries:
                ctx.in_step = False
                time.sleep(min(defn.retry_delay * (2 ** (attempt - 1)), 30.0))
                ctx.check_interrupts()
                continue
            raise StepError(defn.name, error["type"], error["message"], attempt) from exc
        finally:
            ctx.in_step = False
        ms = (time.perf_counter() - t0) * 1000
        result_json, ctx.last_result_text = encode(result, what=f"the result of step {defn.name}")
        return result_json, attempt, started, ms
