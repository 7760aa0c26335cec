"""Replay: look up (run, position); if recorded, return the record; else execute and record.

This is the whole of deterministic replay. A workflow re-runs from the top on every resume;
each journaled call takes the next position, and a position that was recorded returns its
record without executing. A record whose step name or arguments differ from the call is
non-determinism, reported and never papered over.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone

from journal.blobs import INLINE_LIMIT
from journal.errors import NondeterminismError, StepError
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.registry import StepDef
from journal.serialization import dumps, encode, exception_text, storable, storable_text, text_fingerprint

MAX_ARGS_IN_RECORD = 20_000  # bytes of arguments kept in the record for people to read


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
    if "result_ref" in payload:
        from journal.blobs import load_json

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


def record_value(ctx, name: str, produce: Callable[[], Any]) -> Any:
    """now/random/uuid4: recorded lazily (with the next durable write): nothing durable can
    depend on the value before that write, so losing it in a crash is harmless."""
    ctx.check_interrupts()
    position = ctx.next_position()
    record = lookup(ctx, position, name)
    if record is not None:
        return record["payload"]["result"]
    value = storable(produce(), what=f"the value of {name}")  # live and replay see the same, storable value
    ctx.writer.record(EventKind.STEP_COMPLETED, {"result": value, "kind": name}, position=position,
                      step_name=name, durability="exit")
    return value


def result_payload(result_json: Any) -> dict:
    """Large results go to the blob store; the journal row keeps a reference (storage O(n))."""
    from journal.blobs import INLINE_LIMIT, store_json

    text_len = len(str(result_json)) if result_json is not None else 0
    if text_len > INLINE_LIMIT:
        return {"result_ref": store_json(result_json)}
    return {"result": result_json}


def span(ctx, name: str, kind: str, position: int | None, started, duration_ms: float, *, status: str = "ok",
         error: str = "", attempt: int = 1, **fields: Any) -> None:
    ctx.writer.add_span({
        "span_id": os.urandom(8).hex(), "parent_span_id": "", "name": name, "kind": kind, "position": position,
        "attempt": attempt, "status": status, "error": storable_text(error)[:2000], "started_at": started,
        "ended_at": started + timedelta(milliseconds=duration_ms), "duration_ms": duration_ms, **fields,
    })


def invoke_step(ctx, defn: StepDef, args: tuple, kwargs: dict) -> Any:
    ctx.check_interrupts()
    position = ctx.next_position()
    call, call_text = encode({"args": list(args), "kwargs": kwargs}, what=f"the arguments of step {defn.name}")
    args_hash = text_fingerprint(call_text)
    record = lookup(ctx, position, defn.name, args_hash)
    if record is not None:
        return recorded_result(record)
    if defn.effect:
        from journal.effects import run_effect

        return run_effect(ctx, defn, position, call, args_hash)
    return execute(ctx, defn, position, call, args_hash, call_text)


def call_with_retries(ctx, defn: StepDef, position: int, call: dict, extra_kwargs: dict | None = None):
    """Run the function, retrying with backoff; returns (result_json, attempt, started, ms) or raises StepError."""
    attempt = 0
    while True:
        attempt += 1
        started = timezone.now()
        t0 = time.perf_counter()
        ctx.in_step = True
        try:
            result = defn.fn(*call["args"], **call["kwargs"], **(extra_kwargs or {}))
        except Exception as exc:
            ms = (time.perf_counter() - t0) * 1000
            error_type, message = exception_text(exc)  # a lone surrogate or NUL is escaped, never a failed write
            error = {"type": error_type, "message": message[:4000]}
            span(ctx, defn.name, SpanKind.EFFECT if defn.effect else SpanKind.STEP, position, started, ms,
                 status="error", error=f"{error['type']}: {error['message']}", attempt=attempt)
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


def execute(ctx, defn: StepDef, position: int, call: dict, args_hash: str, call_text: str | None = None) -> Any:
    try:
        result_json, attempt, started, ms = call_with_retries(ctx, defn, position, call)
    except StepError as exc:
        ctx.writer.record(EventKind.STEP_COMPLETED, {
            "error": {"type": exc.error_type, "message": exc.message}, "attempt": exc.attempts,
            "args_hash": args_hash, "kind": "step"}, position=position, step_name=defn.name,
            durability=defn.durability)
        raise
    result_text = ctx.last_result_text
    payload = {"args_hash": args_hash, "attempt": attempt, "kind": "step", "started_at": started.isoformat(),
               "duration_ms": round(ms, 3)}
    raw: dict[str, str] = {}
    if len(result_text) > INLINE_LIMIT:
        payload.update(result_payload(result_json))
    else:
        raw["result"] = result_text
    call_text = call_text if call_text is not None else dumps(call)
    if len(call_text) <= MAX_ARGS_IN_RECORD:
        raw["args"] = call_text
    span(ctx, defn.name, SpanKind.STEP, position, started, ms, attempt=attempt)
    from journal.checkpoints import after_step

    after_step(ctx, position, defn, lambda extra: ctx.writer.record(
        EventKind.STEP_COMPLETED, payload, position=position, step_name=defn.name,
        durability=defn.durability, extra=extra, raw=raw), payload)
    return result_json
