"""Model calls as durable steps (what-if forks and run comparison are journal.operations.whatif).

``ctx.model(client, messages, tools=None, prompt_version="", **params)`` takes the next step
position under the name ``model:<model id>``. Live, it calls the client once and records, as
fields of the step's journal record (not free text, so the dashboard can sum and chart them):

    result        the normalised response (content, tool_calls, finish_reason, usage)
    model         the model id the call used
    prompt_version
    tokens_in, tokens_out, cost (USD), latency_ms
    args / request_ref   the request (messages, tools, params); long conversations are stored
                  message by message in the content-addressed blob store, so a growing
                  transcript costs O(new messages) per call, not O(conversation)

The same numbers go on a ``model`` trace span and into the run's totals (``Run.tokens`` and
``Run.cost``, updated in the record's transaction: exact after a crash, live while running; a
model call's record is therefore always written synchronously: re-sending it would cost money).
On replay the recorded response is returned and the model is not called again; a changed prompt
is non-determinism (the request is fingerprinted), reported at its position like any other step.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import F

from journal.engine.checkpoints import after_step
from journal.engine.protocol import MAX_ARGS_IN_RECORD, begin, call_with_retries, recorded_result, result_payload, span
from journal.engine.registry import StepDef
from journal.models.run import Run
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.primitives.llm_clients import ModelError, as_chat_client, cost_of
from journal.store.blobs import get_many, load_json, store_json
from journal.store.errors import StepError
from journal.store.serialization import dumps, fingerprint, to_json

OVERRIDE_KEY = "llm_override"  # in Run.input of a counterfactual fork: {"from_step", "model", "params"}


def _override(ctx, position: int) -> dict | None:
    override = (ctx.run.input or {}).get(OVERRIDE_KEY)
    if override and position >= int(override.get("from_step", 0)):
        return override
    return None


def _store_request(request: dict) -> dict:
    """Small requests inline; large ones as per-message blobs (deduplicated across calls)."""
    if len(dumps(request)) <= MAX_ARGS_IN_RECORD:
        return {"args": request}
    rest = {k: v for k, v in request.items() if k != "messages"}
    return {"request_ref": {"messages": [store_json(m) for m in request["messages"]], "rest": store_json(rest)}}


def load_request(payload: dict) -> dict | None:
    """The request a model-call record was made with (for the stepper and comparisons)."""
    if "args" in payload:
        return payload["args"]
    ref = payload.get("request_ref")
    if not ref:
        return None
    blobs = get_many(ref["messages"])
    return {**load_json(ref["rest"]), "messages": [json.loads(blobs[d]) for d in ref["messages"]]}


def model_call(ctx, client: Any, messages: list[dict], tools: list[dict] | None = None, *,
               prompt_version: str = "", retries: int = 0, retry_delay: float = 1.0, **params: Any) -> dict:
    """Call a model as a durable step; returns the normalised response (see journal.primitives.llm_clients).

    ``client`` is an official ``openai``/``anthropic`` SDK client (sync or async), or any object with
    ``model`` and ``complete()``.
    """
    client = as_chat_client(client)
    if ctx.in_step:  # inside another step's body: that step's record covers it
        model = params.pop("model", None) or client.model
        return client.complete(messages, model=model, tools=tools, **params)
    override = _override(ctx, ctx.position + 1)  # the position ``begin`` takes below
    if override:
        params = {**params, **(override.get("params") or {})}
        if override.get("model"):
            params["model"] = override["model"]
    model = str(params.pop("model", None) or client.model or "")
    if not model:
        raise ModelError("ctx.model needs a model id: pass model= (an SDK client has no default)")
    step_name = f"model:{model}"[:200]
    request = to_json({"model": model, "messages": messages, "tools": tools, "params": params,
                       "prompt_version": prompt_version}, what=f"the request of {step_name}")
    args_hash = fingerprint(request)
    position, record = begin(ctx, step_name, args_hash)
    if record is not None:
        return recorded_result(record)

    # The same execute-with-retries as any step: a span and a step_failed event per failed attempt.
    call_def = StepDef(name=step_name, retries=retries, retry_delay=retry_delay,
                       fn=lambda msgs: client.complete(msgs, model=model, tools=tools, **params))
    try:
        response, attempt, started, ms = call_with_retries(ctx, call_def, position, {"args": [request["messages"]],
                                                           "kwargs": {}}, span_kind=SpanKind.MODEL,
                                                           span_fields={"model": model})
    except StepError as exc:
        ctx.writer.record(EventKind.STEP_COMPLETED, {"error": {"type": exc.error_type, "message": exc.message},
                          "attempt": exc.attempts, "args_hash": args_hash, "kind": "model", "model": model,
                          "prompt_version": prompt_version}, position=position, step_name=step_name)
        raise
    usage = response.get("usage") or {}
    record_model_call(ctx, position, step_name, model=model, request=request, args_hash=args_hash, result=response,
                      tokens_in=int(usage.get("prompt_tokens") or 0),
                      tokens_out=int(usage.get("completion_tokens") or 0),
                      response_model=response.get("model", model), finish_reason=response.get("finish_reason", ""),
                      tool_calls=len(response.get("tool_calls") or []), prompt_version=prompt_version,
                      attempt=attempt, started=started, ms=ms)
    return response


def record_model_call(ctx, position: int, step_name: str, *, model: str, request: dict, args_hash: str | None,
                      result: Any, tokens_in: int, tokens_out: int, response_model: str, finish_reason: str,
                      tool_calls: int, prompt_version: str, attempt: int, started: datetime, ms: float) -> None:
    """Record a model call that ran: its result, tokens and cost in the journal record, a ``model`` span,
    and the run's totals in the record's own transaction. Any model interface (``ctx.model``'s clients,
    a Pydantic AI model) records through here, so the dashboard sums and charts them alike."""
    cost = cost_of(model, tokens_in, tokens_out)
    payload = {
        **result_payload(result), **_store_request(request), "args_hash": args_hash, "kind": "model",
        "model": model, "response_model": response_model or model, "prompt_version": prompt_version,
        "tokens_in": tokens_in, "tokens_out": tokens_out, "cost": cost, "latency_ms": round(ms, 3),
        "duration_ms": round(ms, 3), "started_at": started.isoformat(), "attempt": attempt,
        "finish_reason": finish_reason or "", "tool_calls": tool_calls,
    }
    span(ctx, step_name, SpanKind.MODEL, position, started, ms, model=model, tokens_in=tokens_in,
         tokens_out=tokens_out, cost=Decimal(str(cost)),
         attributes={"prompt_version": prompt_version, "finish_reason": payload["finish_reason"],
                     "tool_calls": tool_calls})

    def commit(extra) -> None:
        def add_totals() -> None:
            # In the record's own transaction: the run's totals count each recorded call exactly once,
            # survive a crash of this worker, and show while the run is still going.
            Run.objects.filter(id=ctx.run.id, epoch=ctx.epoch).update(
                tokens=F("tokens") + tokens_in + tokens_out, cost=F("cost") + Decimal(str(cost)))
            if extra is not None:
                extra()

        ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=position, step_name=step_name,
                          extra=add_totals)

    after_step(ctx, position, None, commit, payload)  # the checkpoint decision goes in the record
