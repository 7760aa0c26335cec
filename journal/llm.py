"""Model calls as durable steps, counterfactual forks ("same history, other model"), and run comparison.

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

import time
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from journal.errors import BadArgumentsError, RunNotFoundError, StepError
from journal.llm_clients import cost_of
from journal.models.run import Run
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.replay import MAX_ARGS_IN_RECORD, lookup, recorded_result, result_payload, span
from journal.serialization import dumps, fingerprint, to_json

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
    from journal.blobs import store_json

    rest = {k: v for k, v in request.items() if k != "messages"}
    return {"request_ref": {"messages": [store_json(m) for m in request["messages"]], "rest": store_json(rest)}}


def load_request(payload: dict) -> dict | None:
    """The request a model-call record was made with (for the stepper and comparisons)."""
    if "args" in payload:
        return payload["args"]
    ref = payload.get("request_ref")
    if not ref:
        return None
    from journal.blobs import get_many, load_json

    blobs = get_many(ref["messages"])
    import json

    return {**load_json(ref["rest"]), "messages": [json.loads(blobs[d]) for d in ref["messages"]]}


def model_call(ctx, client: Any, messages: list[dict], tools: list[dict] | None = None, *,
               prompt_version: str = "", **params: Any) -> dict:
    """Call a model as a durable step; returns the normalised response (see journal.llm_clients)."""
    if ctx.in_step:  # inside another step's body: that step's record covers it
        model = params.pop("model", None) or client.model
        return client.complete(messages, model=model, tools=tools, **params)
    ctx.check_interrupts()
    position = ctx.next_position()
    override = _override(ctx, position)
    if override:
        params = {**params, **(override.get("params") or {})}
        if override.get("model"):
            params["model"] = override["model"]
    model = str(params.pop("model", None) or client.model)
    step_name = f"model:{model}"[:200]
    request = to_json({"model": model, "messages": messages, "tools": tools, "params": params,
                       "prompt_version": prompt_version}, what=f"the request of {step_name}")
    args_hash = fingerprint(request)
    record = lookup(ctx, position, step_name, args_hash)
    if record is not None:
        return recorded_result(record)

    started = timezone.now()
    t0 = time.perf_counter()
    ctx.in_step = True
    try:
        response = client.complete(request["messages"], model=model, tools=tools, **params)
    except Exception as exc:
        ms = (time.perf_counter() - t0) * 1000
        error = {"type": type(exc).__name__, "message": str(exc)[:4000]}
        span(ctx, step_name, SpanKind.MODEL, position, started, ms, status="error",
             error=f"{error['type']}: {error['message']}", model=model)
        ctx.writer.record(EventKind.STEP_COMPLETED, {"error": error, "attempt": 1, "args_hash": args_hash,
                          "kind": "model", "model": model, "prompt_version": prompt_version},
                          position=position, step_name=step_name)
        raise StepError(step_name, error["type"], error["message"], 1) from exc
    finally:
        ctx.in_step = False
    ms = (time.perf_counter() - t0) * 1000
    response = to_json(response, what=f"the response of {step_name}")
    usage = response.get("usage") or {}
    tokens_in, tokens_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cost = cost_of(model, tokens_in, tokens_out)
    payload = {
        **result_payload(response), **_store_request(request), "args_hash": args_hash, "kind": "model",
        "model": model, "response_model": response.get("model", model), "prompt_version": prompt_version,
        "tokens_in": tokens_in, "tokens_out": tokens_out, "cost": cost, "latency_ms": round(ms, 3),
        "duration_ms": round(ms, 3), "started_at": started.isoformat(), "attempt": 1,
        "finish_reason": response.get("finish_reason", ""), "tool_calls": len(response.get("tool_calls") or []),
    }
    span(ctx, step_name, SpanKind.MODEL, position, started, ms, model=model, tokens_in=tokens_in,
         tokens_out=tokens_out, cost=Decimal(str(cost)),
         attributes={"prompt_version": prompt_version, "finish_reason": payload["finish_reason"],
                     "tool_calls": payload["tool_calls"]})
    from journal.checkpoints import after_step

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
    return response


# -- counterfactual replay ------------------------------------------------------------------

def fork_with_model(run_id, at_step: int, *, model: str | None = None, params: dict | None = None,
                    actor: str = "") -> str:
    """Fork ``run_id`` at a model-call step so that call, and every later one, uses another model
    or other parameters: the same history up to ``at_step``, then a different model.

    The override lives in the new run's input, so its own replays stay deterministic.
    """
    import journal
    from journal.api import append_event
    from journal.models import SessionEvent

    if not model and not params:
        raise BadArgumentsError("fork_with_model needs a model= or params= to change")
    if params is not None and not isinstance(params, dict):
        raise BadArgumentsError("params must be a dict of model parameters, e.g. {'temperature': 0.7}")
    params = to_json(params or {}, what="the model parameters")
    record = SessionEvent.objects.steps().filter(run_id=run_id, position=at_step).first()
    if record is None:
        if not Run.objects.filter(id=run_id).exists():
            raise RunNotFoundError(f"no run with id {run_id!r}")
        raise BadArgumentsError(f"run {run_id} has no recorded step {at_step}")
    if not record.step_name.startswith("model:"):
        raise BadArgumentsError(f"step {at_step} of run {run_id} is {record.step_name!r}, not a model call")
    override = {"from_step": int(at_step), "model": model or "", "params": params,
                "original_model": record.step_name[len("model:"):]}
    with transaction.atomic():  # no worker can claim the fork before it carries its override
        new_id = journal.fork(run_id, at_step, actor=actor,
                              reason=f"counterfactual: step {at_step} with {model or 'the same model'} {params or ''}")
        run = Run.objects.select_for_update().get(id=new_id)
        run.input = {**run.input, OVERRIDE_KEY: override}
        run.save(update_fields=["input"])
        append_event(new_id, EventKind.LOG, {"message": f"model override from step {at_step}", **override},
                     actor=actor)
    return str(new_id)


def _result(payload: dict) -> Any:
    if "result_ref" in payload:
        from journal.blobs import load_json

        return load_json(payload["result_ref"])
    return payload.get("result")


def _view(step_name: str, payload: dict) -> dict:
    result = _result(payload)
    view: dict[str, Any] = {"step_name": step_name, "kind": payload.get("kind", "step")}
    if "error" in payload:
        view["error"] = f"{payload['error'].get('type')}: {payload['error'].get('message')}"
    if payload.get("kind") == "model":
        view.update({
            "model": payload.get("model", ""), "prompt_version": payload.get("prompt_version", ""),
            "tokens_in": payload.get("tokens_in", 0), "tokens_out": payload.get("tokens_out", 0),
            "cost": payload.get("cost", 0.0), "latency_ms": payload.get("latency_ms", 0.0),
            "content": (result or {}).get("content", "") if isinstance(result, dict) else "",
            "tool_calls": [c.get("name") for c in (result or {}).get("tool_calls", [])] if isinstance(result, dict)
            else [],
        })
    else:
        text = dumps(result) if result is not None else ""
        view["result"] = text if len(text) <= 2000 else text[:2000] + "…"
    # same step, same request and same result: a changed model or parameter shows even when the text agrees
    view["fingerprint"] = fingerprint([payload.get("args_hash"), result if "error" not in payload else "error"])
    return view


def _summary(run, steps: dict[int, dict]) -> dict:
    model_steps = [s for s in steps.values() if s["kind"] == "model"]
    duration = run.duration
    return {
        "run_id": str(run.id), "agent": run.agent, "status": run.status,
        "forked_from": str(run.forked_from_id) if run.forked_from_id else None, "fork_step": run.fork_step,
        "override": (run.input or {}).get(OVERRIDE_KEY),
        "models": sorted({s["model"] for s in model_steps}),
        "model_calls": len(model_steps),
        "tokens_in": sum(s["tokens_in"] for s in model_steps),
        "tokens_out": sum(s["tokens_out"] for s in model_steps),
        "tokens": int(run.tokens), "cost": float(run.cost),
        "step_cost": round(sum(s["cost"] for s in model_steps), 6),
        "latency_ms": round(sum(s["latency_ms"] for s in model_steps), 3),
        "duration_s": duration.total_seconds() if duration else None,
        "steps": len(steps), "output": run.output, "error": run.error,
    }


def compare_runs(run_a, run_b, *, models_only: bool = False) -> dict:
    """Side by side: two runs' summaries and their step records aligned by position.

    Pure (reads only). ``first_difference`` is the first position whose step name, request or
    result differs; ``same_output`` compares the outputs. Plain dicts, ready for a template or JSON.
    """
    from journal.api import get_run
    from journal.models import SessionEvent

    runs = [r if hasattr(r, "status") else get_run(r) for r in (run_a, run_b)]
    per_run: list[dict[int, dict]] = []
    for run in runs:
        steps: dict[int, dict] = {}
        for position, name, payload in (SessionEvent.objects.steps().filter(run_id=run.id).order_by("seq")
                                        .values_list("position", "step_name", "payload")):
            steps[position] = _view(name, payload)
        per_run.append(steps)
    positions = sorted(set(per_run[0]) | set(per_run[1]))
    rows = []
    first_difference = None
    for position in positions:
        a, b = per_run[0].get(position), per_run[1].get(position)
        same = a is not None and b is not None and a["step_name"] == b["step_name"] and \
            a["fingerprint"] == b["fingerprint"]
        if not same and first_difference is None:
            first_difference = position
        if models_only and not ((a and a["kind"] == "model") or (b and b["kind"] == "model")):
            continue
        rows.append({"position": position, "a": a, "b": b, "same": same})
    return {
        "a": _summary(runs[0], per_run[0]), "b": _summary(runs[1], per_run[1]), "steps": rows,
        "first_difference": first_difference, "same_output": runs[0].output == runs[1].output,
    }
