"""Compensation (saga): undo a run's completed effects in reverse order, each exactly once.

Declaring one::

    def refund(result, order_id, amount, *, idempotency_key):   # the compensation contract
        payments.refund(result["charge_id"], key=idempotency_key)

    @journal.step(effect=True, compensate=refund)
    def charge(order_id, amount, *, idempotency_key): ...

A compensation is called with the original effect's recorded **result** first, then the
effect's own positional and keyword **arguments** as recorded, and ``idempotency_key=`` set to
``"<the effect's key>:compensate"``. It may be a plain function or a ``@journal.step`` function
(its undecorated body is called). Its return value (JSON) is kept in the ledger.

When: a run that fails past effects with compensations goes to ``compensating`` (``after_failure``);
an operator can ask for it on a failed, cancelled or needs_attention run (``compensate``); a
cancelled run is compensated when its workflow says ``@journal.workflow(compensate_on_cancel=True)``.
A worker then claims the ``compensating`` run and ``compensate_run`` undoes the effects, newest
first; the run ends ``compensated``.

Exactly once, like effects: the intent (``compensation_started``) is committed before the call,
and the ledger row turns ``compensated`` in the same transaction as the ``compensated`` event.
A crash in between leaves the compensation in doubt; since the saga has to finish, it is called
again under the **same key**, so the outside system must treat a repeated key as a no-op (as it
must for the effect itself). A compensation that keeps failing stops the run in needs_attention;
``compensate`` again continues with the ones not yet undone.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.driver.settling import end_fields, settle_move
from journal.engine import registry
from journal.engine.protocol import span
from journal.models import EffectStatus, EventKind, Run, RunStatus, SessionEvent, SideEffect
from journal.models.trace import SpanKind
from journal.store import faults, runstate
from journal.store.doorbell import notify
from journal.store.errors import NeedsAttention, Released, RunStateError
from journal.store.serialization import to_json

log = logging.getLogger(__name__)

ATTEMPTS = 3


def _pending(run_id):
    """Effects still to undo: completed, with a compensation; newest first."""
    return SideEffect.objects.filter(run_id=run_id, status=EffectStatus.COMPLETED).exclude(
        compensation="").order_by("-position")


def has_effects_to_undo(run_id) -> bool:
    """Whether a compensation would have anything to undo (``begin`` refuses otherwise)."""
    return _pending(run_id).exists()


def will_compensate(run) -> bool:
    """A failed run whose worker is about to turn it into a compensating one: not finished yet."""
    return run.status == RunStatus.FAILED and _pending(run.id).exists() and not SessionEvent.objects.filter(
        run_id=run.id, kind=EventKind.COMPENSATION_STARTED).exists()


BEGIN_FIELDS: dict[str, Any] = {"lease_owner": "", "lease_expires_at": None, "finished_at": None,
                                "waiting_for": None, "wake_at": None}


def _start_from_worker(ctx, from_status: str, reason: str) -> None:
    """Turn a run the worker just settled into a compensating run, fenced by the worker's epoch."""
    positions = list(_pending(ctx.run_id).values_list("position", flat=True))
    if not positions:
        return

    def switch() -> None:
        if not runstate.move(ctx.run_id, RunStatus.COMPENSATING, cause=runstate.Cause.SAGA, sources=(from_status,),
                             at_epoch=ctx.epoch, **BEGIN_FIELDS):
            raise RunStateError(f"run {ctx.run_id} left {from_status} before compensation could start")

    try:
        ctx.writer.record(EventKind.COMPENSATION_STARTED, {"scope": "run", "reason": reason, "effects": positions},
                          actor=ctx.worker_id, extra=switch)
    except RunStateError as exc:
        log.warning("%s", exc)
        return
    notify(ctx.run_id)


def after_failure(ctx) -> None:
    """A run failed: if it completed effects that declare compensations, undo them."""
    _start_from_worker(ctx, RunStatus.FAILED, "the run failed after effects with compensations")


def after_cancel(ctx) -> None:
    """A running run was cancelled: compensate when its workflow asks for it."""
    if _wants_compensation_on_cancel(ctx.run.agent):
        _start_from_worker(ctx, RunStatus.CANCELLED, "cancelled; the workflow compensates on cancel")


def after_cancel_idle(run_id, actor: str = "") -> None:
    """A run no worker held was cancelled: compensate when its workflow asks for it."""
    run = Run.objects.filter(id=run_id).only("agent").first()
    if run is None or not _wants_compensation_on_cancel(run.agent):
        return
    try:
        begin(run_id, (RunStatus.CANCELLED,), cause=runstate.Cause.SAGA, actor=actor,
              reason="cancelled; the workflow compensates on cancel", action=None)
    except RunStateError:
        return  # nothing to undo


def _wants_compensation_on_cancel(agent: str) -> bool:
    try:
        return bool(registry.get_workflow(agent).options.get("compensate_on_cancel"))
    except Exception:
        return False


def begin(run_id, allowed: tuple, *, cause: runstate.Cause, actor: str, reason: str, action: str | None) -> None:
    """Turn a run no worker holds into a compensating one, with its events; RunStateError if it cannot."""
    positions = list(_pending(run_id).values_list("position", flat=True))
    if not positions:
        raise RunStateError(f"run {run_id} has no completed effect with a compensation: there is nothing to undo")
    with transaction.atomic():
        if not runstate.move(run_id, RunStatus.COMPENSATING, cause=cause, sources=allowed, **BEGIN_FIELDS):
            status = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
            raise RunStateError(f"cannot compensate run {run_id}: it is {status}, and compensation needs "
                                f"{' or '.join(allowed)}")
        if action:
            runstate.append_event(run_id, EventKind.OPERATOR_ACTION, {"action": action, "reason": reason},
                                  actor=actor)
        runstate.append_event(run_id, EventKind.COMPENSATION_STARTED,
                              {"scope": "run", "reason": reason, "effects": positions}, actor=actor)
    notify(run_id)


# -- the worker's part ----------------------------------------------------------------------------

def resolve_compensation(effect: SideEffect) -> Callable[..., Any]:
    """The compensating function: the current code's declaration first, else the recorded dotted name."""
    step = registry.steps().get(effect.step_name)
    fn = step.compensate if step is not None and step.compensate is not None else None
    if fn is None:
        step_def = registry.steps().get(effect.compensation)
        if step_def is not None:
            fn = step_def.fn
        else:
            module, _, name = effect.compensation.rpartition(".")
            try:
                fn = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError):
                raise NeedsAttention(f"the compensation {effect.compensation!r} of {effect.step_name} "
                                     f"(step {effect.position}) cannot be found in the deployed code") from None
    inner = getattr(fn, "__durable_step__", None)
    return inner.fn if inner is not None else fn


def _effect_key(run_id, effect: SideEffect) -> str:
    """The key the outside world saw for this effect (a fork's inherited effect keeps its parent's)."""
    payload = (
        SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, position=effect.position)
        .order_by("-seq").values_list("payload", flat=True).first()
    ) or {}
    return payload.get("idempotency_key") or effect.idempotency_key


def compensate_run(ctx) -> None:
    """Undo every completed effect with a compensation, newest first; then mark the run compensated."""
    for effect in list(_pending(ctx.run_id)):
        if ctx.interrupt in ("release", "pause"):  # a compensating run is not cancelled: it finishes undoing
            raise Released(ctx.interrupt)
        _compensate_one(ctx, effect)
    undone = SideEffect.objects.filter(run_id=ctx.run_id, status=EffectStatus.COMPENSATED).count()
    move = settle_move(ctx, RunStatus.COMPENSATED, **end_fields(ctx), finished_at=timezone.now(), waiting_for=None,
                       wake_at=None)
    ctx.writer.record(EventKind.COMPENSATED, {"scope": "run", "compensated": undone}, actor=ctx.worker_id,
                      extra=move)


def _compensate_one(ctx, effect: SideEffect) -> None:
    fn = resolve_compensation(effect)
    key = f"{_effect_key(ctx.run_id, effect)}:compensate"
    if effect.args.get("truncated"):
        raise NeedsAttention(f"cannot compensate {effect.step_name} (step {effect.position}): its arguments were "
                             "too large to record; undo it by hand, then mark the run")
    info = {"effect_position": effect.position, "step_name": effect.step_name, "idempotency_key": key}
    in_doubt = SessionEvent.objects.filter(run_id=ctx.run_id, kind=EventKind.COMPENSATION_STARTED,
                                           payload__effect_position=effect.position).exists()
    ctx.writer.record(EventKind.COMPENSATION_STARTED, {**info, "again": in_doubt}, actor=ctx.worker_id,
                      extra=lambda: None)  # the intent is durable before the call
    faults.inject("compensation_started", position=effect.position, run_id=ctx.run_id)
    args, kwargs = effect.args.get("args", []), effect.args.get("kwargs", {})
    started = timezone.now()
    t0 = time.perf_counter()
    error = ""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            result = to_json(fn(effect.result, *args, **kwargs, idempotency_key=key),
                             what=f"the result of the compensation of {effect.step_name}")
            break
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("compensation of %s (run %s, step %s) failed (attempt %d): %s", effect.step_name,
                        ctx.run_id, effect.position, attempt, error)
            if attempt < ATTEMPTS:
                time.sleep(0.2 * 2 ** (attempt - 1))
    else:
        ms = (time.perf_counter() - t0) * 1000
        span(ctx, f"compensate {effect.step_name}", SpanKind.COMPENSATION, effect.position, started, ms,
             status="error", error=error, attempt=ATTEMPTS)
        raise NeedsAttention(f"the compensation of {effect.step_name} (step {effect.position}, key {key}) failed "
                             f"{ATTEMPTS} times: {error[:500]}. Fix the cause, then compensate again.",
                             position=effect.position)
    faults.inject("compensation_executed", position=effect.position, run_id=ctx.run_id)
    ms = (time.perf_counter() - t0) * 1000
    span(ctx, f"compensate {effect.step_name}", SpanKind.COMPENSATION, effect.position, started, ms,
         attempt=attempt, attributes={"idempotency_key": key})

    def done() -> None:
        SideEffect.objects.filter(id=effect.id, status=EffectStatus.COMPLETED).update(
            status=EffectStatus.COMPENSATED, compensation_result=result, compensated_at=timezone.now())

    ctx.writer.record(EventKind.COMPENSATED, {**info, "result": result}, actor=ctx.worker_id, extra=done)
