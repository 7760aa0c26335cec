"""What-if runs: the same history with another model ("counterfactual replay"), and two runs side by side.

A fork at a model-call step carries a model override in its input (``journal.primitives.llm``
applies it from that step on), so the new run's own replays stay deterministic.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.db import transaction

from journal.engine.protocol import result_of
from journal.models import Run, SessionEvent
from journal.models.session import EventKind
from journal.operations.runs import get_run
from journal.operations.timetravel import fork
from journal.primitives.llm import OVERRIDE_KEY
from journal.primitives.llm_clients import prices
from journal.store import runstate
from journal.store.errors import BadArgumentsError, RunNotFoundError
from journal.store.serialization import dumps, fingerprint, to_json

__all__ = ["compare_runs", "fork_with_model", "model_choices"]


def model_choices(used: str = "") -> list[str]:
    """The models a what-if can switch a model call to: DURABLE_WHATIF_MODELS, the configured
    DURABLE_LLM_MODEL and the models with a configured price, the one the step used first."""
    configured = [*getattr(settings, "DURABLE_WHATIF_MODELS", []), os.environ.get("DURABLE_LLM_MODEL", ""),
                  *prices()]
    names = [used, *configured] if used else configured
    return list(dict.fromkeys(name for name in names if name))


def fork_with_model(run_id, at_step: int, *, model: str | None = None, params: dict | None = None,
                    actor: str = "") -> str:
    """Fork ``run_id`` at a model-call step so that call, and every later one, uses another model
    or other parameters: the same history up to ``at_step``, then a different model.

    The override lives in the new run's input, so its own replays stay deterministic.
    """
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
        new_id = fork(run_id, at_step, actor=actor,
                              reason=f"counterfactual: step {at_step} with {model or 'the same model'} {params or ''}")
        run = Run.objects.select_for_update().get(id=new_id)
        run.input = {**run.input, OVERRIDE_KEY: override}
        run.save(update_fields=["input"])
        runstate.append_event(new_id, EventKind.LOG, {"message": f"model override from step {at_step}", **override},
                     actor=actor)
    return str(new_id)


def _view(step_name: str, payload: dict) -> dict:
    result = result_of(payload)
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
