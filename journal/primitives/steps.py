"""Steps: a ``@journal.step`` function called inside a workflow, replayed from its record or executed once.

The protocol (``journal.engine.protocol``) decides replay; this module executes a plain step and
records its outcome (result or final error) with the checkpoint decision in one write. Effects
take the ledger path (``journal.primitives.effects``).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.engine.checkpoints import after_step, note_result
from journal.engine.protocol import MAX_ARGS_IN_RECORD, begin, call_with_retries, recorded_result, result_payload, span
from journal.engine.registry import StepDef
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.primitives.effects import run_effect
from journal.store import faults
from journal.store.blobs import INLINE_LIMIT
from journal.store.errors import StepError
from journal.store.serialization import dumps, encode, exception_text, text_fingerprint


def invoke_step(ctx, defn: StepDef, args: tuple, kwargs: dict) -> Any:
    call, call_text = encode({"args": list(args), "kwargs": kwargs}, what=f"the arguments of step {defn.name}")
    args_hash = text_fingerprint(call_text)
    position, record = begin(ctx, defn.name, args_hash)
    if record is not None:
        return recorded_result(record)
    if defn.effect:
        return run_effect(ctx, defn, position, call, args_hash)
    if defn.atomic:
        return run_atomic(ctx, defn, position, call, args_hash)
    return execute(ctx, defn, position, call, args_hash, call_text)


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
    after_step(ctx, position, defn, lambda extra: ctx.writer.record(
        EventKind.STEP_COMPLETED, payload, position=position, step_name=defn.name,
        durability=defn.durability, extra=extra, raw=raw), payload)
    note_result(ctx, position, result_text)
    return result_json


def run_atomic(ctx, defn: StepDef, position: int, call: dict, args_hash: str) -> Any:
    """The step's writes and its record in one transaction (``@journal.step(atomic=True)``).

    Everything recorded before is made durable first (as before an effect), so the record can
    commit alone with the writes. If the step raises, its writes roll back with the attempt and it
    is retried as any step is; if the record cannot be written (the lease was lost, the database
    went away), the writes roll back too: a zombie worker cannot leave a write behind.
    """
    ctx.writer.barrier()
    attempt = 0
    while True:
        attempt += 1
        started = timezone.now()
        t0 = time.perf_counter()
        failure: Exception | None = None
        with transaction.atomic():
            ctx.in_step = True
            try:
                result = defn.fn(*call["args"], **call["kwargs"])
            except Exception as exc:  # the step's own code: roll its writes back, below
                failure = exc
            finally:
                ctx.in_step = False
            if failure is None:
                result_json, _text = encode(result, what=f"the result of step {defn.name}")
                ms = (time.perf_counter() - t0) * 1000
                payload = {"args_hash": args_hash, "attempt": attempt, "kind": "step", "atomic": True,
                           "started_at": started.isoformat(), "duration_ms": round(ms, 3),
                           **result_payload(result_json)}
                if len(dumps(call)) <= MAX_ARGS_IN_RECORD:
                    payload["args"] = call
                span(ctx, defn.name, SpanKind.STEP, position, started, ms, attempt=attempt)
                after_step(ctx, position, defn, _record_now(ctx, defn, position, payload), payload)
                faults.inject("atomic_before_commit", position=position, run_id=ctx.run_id)
            else:
                transaction.set_rollback(True)
        if failure is None:
            faults.inject("atomic_committed", position=position, run_id=ctx.run_id)
            return result_json
        if not _failed_attempt(ctx, defn, position, attempt, started, t0, failure):
            ctx.writer.record(EventKind.STEP_COMPLETED, {
                "error": _error_of(failure), "attempt": attempt, "args_hash": args_hash, "kind": "step",
                "atomic": True}, position=position, step_name=defn.name)
            error = _error_of(failure)
            raise StepError(defn.name, error["type"], error["message"], attempt) from failure


def _record_now(ctx, defn: StepDef, position: int, payload: dict):
    """The step's record, written now (inside the step's transaction) with the checkpoint if one is taken."""
    def commit(extra) -> None:
        ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=position, step_name=defn.name,
                          extra=extra or _in_this_transaction)
    return commit


def _in_this_transaction() -> None:
    """An ``extra`` that does nothing: it makes the writer write now, inside the step's transaction."""


def _error_of(exc: Exception) -> dict:
    error_type, message = exception_text(exc)
    return {"type": error_type, "message": message[:4000]}


def _failed_attempt(ctx, defn: StepDef, position: int, attempt: int, started, t0: float, exc: Exception) -> bool:
    """Record a failed attempt (its writes already rolled back); True when it will be retried."""
    error = _error_of(exc)
    span(ctx, defn.name, SpanKind.STEP, position, started, (time.perf_counter() - t0) * 1000, status="error",
         error=f"{error['type']}: {error['message']}", attempt=attempt)
    again = attempt <= defn.retries
    ctx.writer.record(EventKind.STEP_FAILED, {"error": error, "attempt": attempt, "will_retry": again},
                      step_name=defn.name, durability="exit")
    if again:
        time.sleep(min(defn.retry_delay * (2 ** (attempt - 1)), 30.0))
        ctx.check_interrupts()
    return again
