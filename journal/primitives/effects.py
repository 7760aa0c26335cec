"""Exactly-once effects: the ledger protocol.

1. commit ``SideEffect(key, started)`` with everything recorded before it (a barrier);
2. execute with the key (and the fencing token, when the function accepts one);
3. commit the result and the ``step_completed`` record in one transaction.

Resuming finds ``completed``: the record replays and nothing executes. Finds ``started`` with
no result: the step's ``on_in_doubt`` policy decides: ``retry`` (idempotent under its key),
``reconcile`` (ask the outside system), or, by default, ``needs_attention``: the engine never
guesses whether an interrupted payment went through.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from journal.engine.checkpoints import after_step
from journal.engine.protocol import MAX_ARGS_IN_RECORD, call_with_retries, result_payload, span
from journal.engine.registry import StepDef
from journal.models import EffectStatus, EventKind, SessionEvent, SideEffect
from journal.models.trace import SpanKind
from journal.store import faults
from journal.store.errors import NeedsAttention, StepError
from journal.store.outage import workflow_code
from journal.store.serialization import to_json


def idempotency_key(run_id: str, position: int) -> str:
    return f"{run_id}:{position}"


def run_effect(ctx, defn: StepDef, position: int, call: dict, args_hash: str) -> Any:
    key = idempotency_key(ctx.run_id, position)
    faults.inject("effect_lookup", position=position, run_id=ctx.run_id)
    existing = SideEffect.objects.filter(run_id=ctx.run_id, position=position).first()
    if existing is not None and existing.status == EffectStatus.STARTED:
        outcome = _resolve_in_doubt(ctx, defn, existing, call)
        if outcome is not None:
            return _complete(ctx, defn, position, existing.id, call, args_hash, outcome[0], existing.attempts, None, 0)
        SideEffect.objects.filter(id=existing.id).update(attempts=existing.attempts + 1)
        effect_id = existing.id
    elif existing is not None and existing.status in (EffectStatus.COMPLETED, EffectStatus.SKIPPED):
        # The record was superseded (an operator's retry) but the world already has this effect.
        return _complete(ctx, defn, position, existing.id, call, args_hash, existing.result, existing.attempts, None, 0)
    elif existing is not None:  # failed earlier: the outside system refused it; try again under the same key
        SideEffect.objects.filter(id=existing.id).update(status=EffectStatus.STARTED, attempts=existing.attempts + 1)
        effect_id = existing.id
    else:
        created: list[SideEffect] = []

        def intent() -> None:  # may run again when the write is retried: keep only the committed row
            created[:] = [SideEffect.objects.create(
                run_id=ctx.run_id, position=position, step_name=defn.name, idempotency_key=key, epoch=ctx.epoch,
                args=call if len(str(call)) <= MAX_ARGS_IN_RECORD else {"truncated": True},
                compensation=_dotted(defn.compensate),
            )]

        ctx.writer.record(EventKind.EFFECT_STARTED, {"idempotency_key": key, "fencing_token": ctx.epoch},
                          position=position, step_name=defn.name, extra=intent)
        effect_id = created[0].id
    faults.inject("effect_started", position=position, run_id=ctx.run_id)

    extra_kwargs: dict[str, Any] = {"idempotency_key": key}
    if defn.accepts_fencing_token:
        extra_kwargs["fencing_token"] = ctx.epoch
    try:
        result_json, attempt, started, ms = call_with_retries(ctx, defn, position, call, extra_kwargs)
    except StepError as exc:
        message = str(exc)[:4000]

        def failed() -> None:
            SideEffect.objects.filter(id=effect_id).update(status=EffectStatus.FAILED, error=message)

        ctx.writer.record(EventKind.STEP_COMPLETED, {
            "error": {"type": exc.error_type, "message": exc.message}, "attempt": exc.attempts,
            "args_hash": args_hash, "kind": "effect", "idempotency_key": key}, position=position,
            step_name=defn.name, extra=failed)
        raise
    faults.inject("effect_executed", position=position, run_id=ctx.run_id)
    return _complete(ctx, defn, position, effect_id, call, args_hash, result_json, attempt, started, ms)


def _complete(ctx, defn, position, effect_id, call, args_hash, result_json, attempt, started, ms) -> Any:
    key = idempotency_key(ctx.run_id, position)
    payload = {**result_payload(result_json), "args_hash": args_hash, "attempt": attempt, "kind": "effect",
               "idempotency_key": key, "fencing_token": ctx.epoch, "duration_ms": round(ms, 3)}
    if started is not None:
        payload["started_at"] = started.isoformat()
        span(ctx, defn.name, SpanKind.EFFECT, position, started, ms, attempt=attempt,
             attributes={"idempotency_key": key})
    if len(str(call)) <= MAX_ARGS_IN_RECORD:
        payload["args"] = call
    def commit(extra) -> None:
        def done() -> None:
            SideEffect.objects.filter(id=effect_id).update(
                status=EffectStatus.COMPLETED, result=result_json, completed_at=timezone.now(), error="")
            if extra is not None:
                extra()

        ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=position, step_name=defn.name, extra=done)

    after_step(ctx, position, defn, commit, payload)
    return result_json


def _resolve_in_doubt(ctx, defn: StepDef, effect: SideEffect, call: dict) -> tuple[Any] | None:
    """Return (result,) when the outcome is known to be done, None to execute again; or stop the run."""
    if consume_retry_approval(ctx, effect):  # an operator chose "retry with the same key", once
        return None
    if defn.on_in_doubt == "retry":
        ctx.writer.record(EventKind.EFFECT_IN_DOUBT, {"idempotency_key": effect.idempotency_key, "policy": "retry"},
                          position=effect.position, step_name=defn.name, durability="exit")
        return None
    if defn.on_in_doubt == "reconcile":
        with workflow_code():  # the reconcile function is the workflow's code: what it raises is its own
            found = defn.reconcile(effect.idempotency_key, *call["args"], **call["kwargs"])
        ctx.writer.record(EventKind.EFFECT_IN_DOUBT, {"idempotency_key": effect.idempotency_key,
                          "policy": "reconcile", "found": found is not None},
                          position=effect.position, step_name=defn.name, durability="exit")
        if found is None:
            return None
        return (to_json(found, what=f"the reconciled result of {defn.name}"),)
    reason = (
        f"effect {defn.name} (step {effect.position}, key {effect.idempotency_key}) started but its outcome was never "
        "recorded: the worker died mid-call. Check the outside system, then mark it done with its result, retry it "
        "with the same key, or skip it."
    )
    ctx.writer.record(EventKind.EFFECT_IN_DOUBT, {"idempotency_key": effect.idempotency_key, "policy":
                      "needs_attention"}, position=effect.position, step_name=defn.name, durability="exit")
    raise NeedsAttention(reason, effect_id=effect.id, position=effect.position)


def _dotted(fn) -> str:
    if fn is None:
        return ""
    step_def = getattr(fn, "__durable_step__", None)
    return step_def.name if step_def is not None else f"{fn.__module__}.{fn.__qualname__}"


def consume_retry_approval(ctx, effect: SideEffect) -> bool:
    """True once after an operator chose "retry" for this in-doubt effect.

    The approval is used up by the effect_in_doubt record written here (committed before the
    effect executes again), so a second crash mid-call puts the run back in needs_attention.
    """
    approved = (
        SessionEvent.objects.filter(run_id=ctx.run_id, kind=EventKind.OPERATOR_ACTION,
                                    payload__action="resolve_effect", payload__resolution="retry",
                                    payload__position=effect.position)
        .order_by("-seq").values_list("seq", flat=True).first()
    )
    if approved is None:
        return False
    if SessionEvent.objects.filter(run_id=ctx.run_id, kind=EventKind.EFFECT_IN_DOUBT, position=effect.position,
                                   seq__gt=approved).exists():
        return False
    ctx.writer.record(EventKind.EFFECT_IN_DOUBT, {"idempotency_key": effect.idempotency_key,
                      "policy": "operator_retry"}, position=effect.position, step_name=effect.step_name,
                      extra=lambda: None)
    return True
