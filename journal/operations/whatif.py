"""What-if runs: the same history with another model ("counterfactual replay"), and two runs side by side.

A fork at a model-call step carries a model override in its input (``journal.primitives.llm``
applies it from that step on), so the new run's own replays stay deterministic.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import TextField
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

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
    view["fingerprint"] = fingerprint(list(_identity(payload)))
    return view


def _identity(payload: dict) -> tuple:
    """What makes two records the same step: the request and the result (a large result by its content
    address, so nothing is loaded to compare it). Timings are not part of it: a changed model or
    parameter shows even when the text agrees, a slower run of the same step does not. Compared as
    values, not hashed: hashing every record was half the cost of comparing two 10k-step runs."""
    if "error" in payload:
        return payload.get("args_hash"), "error"
    return payload.get("args_hash"), payload.get("result_ref"), payload.get("result")


def _result_json() -> RawSQL:
    """A record's result as JSON text (so "5" and 5 differ, as KT's SQL values would not)."""
    if connection.vendor == "postgresql":
        return RawSQL("(payload -> 'result')::text", ())
    return RawSQL("json_quote(json_extract(payload, '$.result'))", ())


def _same_identity(a: tuple, b: tuple) -> bool:
    """The identity parts as the database's text agree, and neither record is an error (an error's
    identity is its args alone, which the values then decide)."""
    return a == b and a[3] is None


class _Decoded:
    """A run's step records as text, decoded one position at a time when something needs the value."""

    def __init__(self, texts: dict[int, tuple[str, str]]):
        self.texts = texts
        self._values: dict[int, tuple[str, dict]] = {}

    def __getitem__(self, position: int) -> tuple[str, dict]:
        value = self._values.get(position)
        if value is None:
            name, text = self.texts[position]
            value = self._values[position] = (name, json.loads(text))
        return value

    def __len__(self) -> int:
        return len(self.texts)

    def is_model(self, position: int) -> bool:
        text = self.texts[position][1]  # compact (SQLite) or spaced (PostgreSQL's jsonb) text
        return ('"kind":"model"' in text or '"kind": "model"' in text) and self[position][1].get("kind") == "model"

    def model_payloads(self) -> list[dict]:
        return [self[p][1] for p in self.texts if self.is_model(p)]


def _summary(run, steps: _Decoded) -> dict:
    model_steps = steps.model_payloads()
    duration = run.duration
    return {
        "run_id": str(run.id), "agent": run.agent, "status": run.status,
        "forked_from": str(run.forked_from_id) if run.forked_from_id else None, "fork_step": run.fork_step,
        "override": (run.input or {}).get(OVERRIDE_KEY),
        "models": sorted({p.get("model", "") for p in model_steps}),
        "model_calls": len(model_steps),
        "tokens_in": sum(p.get("tokens_in", 0) for p in model_steps),
        "tokens_out": sum(p.get("tokens_out", 0) for p in model_steps),
        "tokens": int(run.tokens), "cost": float(run.cost),
        "step_cost": round(sum(p.get("cost", 0.0) for p in model_steps), 6),
        "latency_ms": round(sum(p.get("latency_ms", 0.0) for p in model_steps), 3),
        "duration_s": duration.total_seconds() if duration else None,
        "steps": len(steps), "output": run.output, "error": run.error,
    }


COMPARE_WINDOW = 100  # step rows shown in detail at once; the alignment itself covers every step


def compare_runs(run_a, run_b, *, models_only: bool = False, start: int | None = None,
                 size: int = COMPARE_WINDOW) -> dict:
    """Side by side: two runs' summaries and their step records aligned by position.

    Pure (reads only). ``first_difference`` is the first position whose step name, request or
    result differs; ``same_output`` compares the outputs. Every position is aligned (one indexed
    read of each journal, no blob loaded: a large result is compared by its content address), but
    only ``size`` rows from ``start`` (by default a little before the first difference) are shown in
    detail, so a 10k-step pair renders what a short one does. Plain dicts, for a template or JSON;
    ``window`` says which rows ``steps`` holds and where the neighbouring windows begin.
    """
    runs = [r if hasattr(r, "status") else get_run(r) for r in (run_a, run_b)]
    # The payloads as the database's text: a record a fork copied is the same text in both runs and
    # needs no decoding to be the same; only the records that differ as text are decoded and compared.
    # A re-run step's record differs in its timings only, so the database also hands over the identity's
    # parts as text (_identity's fields): equal there means the same step without decoding the record
    # (decoding every record was most of the time of two 10k-step runs); different there, the values decide.
    texts: list[dict[int, tuple[str, str]]] = []
    idents: list[dict[int, tuple]] = []
    for run in runs:
        rows = (SessionEvent.objects.steps().filter(run_id=run.id).order_by("seq")
                .annotate(text=Cast("payload", TextField()), i_args=KT("payload__args_hash"),
                          i_ref=KT("payload__result_ref"), i_result=_result_json(),
                          i_error=Cast(KT("payload__error"), TextField()))
                .values_list("position", "step_name", "text", "i_args", "i_ref", "i_result", "i_error"))
        texts.append({})
        idents.append({})
        for position, name, text, *ident in rows:
            texts[-1][position] = (name, text)
            idents[-1][position] = tuple(ident)
    per_run = [_Decoded(t) for t in texts]
    aligned = []
    first_difference = None
    differing = 0
    for position in sorted(set(texts[0]) | set(texts[1])):
        ta, tb = texts[0].get(position), texts[1].get(position)
        same = ta is not None and tb is not None and ta[0] == tb[0] and (
            ta[1] == tb[1] or _same_identity(idents[0][position], idents[1][position])
            or _identity(per_run[0][position][1]) == _identity(per_run[1][position][1]))
        a, b = (per_run[0] if ta else None), (per_run[1] if tb else None)
        if not same:
            differing += 1
            if first_difference is None:
                first_difference = position
        if models_only and not any(side is not None and side.is_model(position) for side in (a, b)):
            continue
        aligned.append((position, a, b, same))
    size = max(1, min(int(size), 1000))
    if start is None:  # a long pair opens a little before where it diverges; a short one whole
        start = 1 if len(aligned) <= size else max(1, (first_difference or 1) - 10)
    index = next((i for i, row in enumerate(aligned) if row[0] >= start), max(0, len(aligned) - size))
    shown = aligned[index:index + size]
    return {
        "a": _summary(runs[0], per_run[0]), "b": _summary(runs[1], per_run[1]),
        "steps": [{"position": position, "a": a and _view(*a[position]), "b": b and _view(*b[position]),
                   "same": same} for position, a, b, same in shown],
        "first_difference": first_difference, "same_output": runs[0].output == runs[1].output,
        "differing": differing,
        "window": {"total": len(aligned), "size": size, "first": shown[0][0] if shown else None,
                   "last": shown[-1][0] if shown else None,
                   "previous": aligned[max(0, index - size)][0] if index > 0 else None,
                   "next": aligned[index + size][0] if index + size < len(aligned) else None,
                   "end": aligned[max(0, len(aligned) - size)][0] if len(aligned) > size else None},
    }
