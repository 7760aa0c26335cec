"""Steps: a ``@journal.step`` function called inside a workflow, replayed from its record or executed once.

The protocol (``journal.engine.protocol``) decides replay; this module executes a plain step and
records its outcome (result or final error) with the checkpoint decision in one write. Effects
take the ledger path (``journal.primitives.effects``).
"""

from __future__ import annotations

from typing import Any

from journal.engine.checkpoints import after_step
from journal.engine.protocol import MAX_ARGS_IN_RECORD, begin, call_with_retries, recorded_result, result_payload, span
from journal.engine.registry import StepDef
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.primitives.effects import run_effect
from journal.store.blobs import INLINE_LIMIT
from journal.store.errors import StepError
from journal.store.serialization import dumps, encode, text_fingerprint


def invoke_step(ctx, defn: StepDef, args: tuple, kwargs: dict) -> Any:
    call, call_text = encode({"args": list(args), "kwargs": kwargs}, what=f"the arguments of step {defn.name}")
    args_hash = text_fingerprint(call_text)
    position, record = begin(ctx, defn.name, args_hash)
    if record is not None:
        return recorded_result(record)
    if defn.effect:
        return run_effect(ctx, defn, position, call, args_hash)
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
    return result_json
