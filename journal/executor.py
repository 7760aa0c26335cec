"""Drive one claimed run: load its journal, run the workflow from the top, settle the outcome.

The workflow is re-executed on every resume; replay makes the recorded prefix free. The
outcome (completed, failed, suspended, cancelled, needs_attention, or given back) is committed
together with everything still buffered, fenced by the epoch of the claim.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import F
from django.utils import timezone

from journal import registry
from journal.context import Context, _current
from journal.errors import (
    Cancelled,
    LeaseLost,
    NeedsAttention,
    NondeterminismError,
    Released,
    Suspend,
    UnknownAgentError,
)
from journal.models import EventKind, Run, RunStatus, SessionEvent, Signal
from journal.serialization import exception_text, storable_text, to_json
from journal.writer import JournalWriter

log = logging.getLogger(__name__)

MARKER_KINDS = (EventKind.WAIT_STARTED, EventKind.TIMER_STARTED, EventKind.APPROVAL_REQUESTED, EventKind.CHILD_STARTED)


@dataclass
class Claim:
    run_id: uuid.UUID
    epoch: int
    recovered_from: str = ""  # the worker whose expired lease this claim took over


def load_journal(run_id) -> tuple[dict, dict, int]:
    """Return (records by position, wait/timer markers by position, last seq)."""
    rows = list(
        SessionEvent.objects.filter(run_id=run_id, position__isnull=False)
        .values_list("seq", "kind", "position", "step_name", "payload")
        .order_by("seq")
    )
    retry_seq = (
        SessionEvent.objects.filter(run_id=run_id, kind=EventKind.OPERATOR_ACTION, payload__action="retry")
        .order_by("-seq").values_list("seq", flat=True).first()
    ) or 0
    last_seq = SessionEvent.objects.filter(run_id=run_id).order_by("-seq").values_list("seq", flat=True).first() or 0
    recorded: dict[int, dict] = {}
    markers: dict[int, dict] = {}
    for seq, kind, position, step_name, payload in rows:
        if kind == EventKind.STEP_COMPLETED:
            if "error" in payload and seq < retry_seq:
                continue  # an operator asked to retry past this failure
            recorded[position] = {"seq": seq, "kind": kind, "step_name": step_name, "payload": payload}
        elif kind in MARKER_KINDS and seq > retry_seq:
            markers.setdefault(position, {})[kind] = payload
    return recorded, markers, last_seq


def _fenced_update(run_id, epoch: int, **fields: Any) -> None:
    if Run.objects.filter(id=run_id, epoch=epoch).update(**fields) != 1:
        raise LeaseLost(f"run {run_id} was claimed by another worker")


def drive(claim: Claim, worker_id: str, on_context: Callable[[Context | None], None] | None = None) -> str:
    """Drive a claimed run until it finishes, suspends or is given back; returns the run's status."""
    run = Run.objects.get(id=claim.run_id)
    if run.epoch != claim.epoch:
        return "lost"
    recorded, markers, last_seq = load_journal(run.id)
    writer = JournalWriter(run.id, claim.epoch, last_seq + 1, mode=run.durability)
    ctx = Context(run=run, writer=writer, recorded=recorded, markers=markers, worker_id=worker_id)
    if on_context:
        on_context(ctx)
    token = _current.set(ctx)
    try:
        return _drive(ctx, run, claim, worker_id)
    finally:
        _current.reset(token)
        writer.close()
        if on_context:
            on_context(None)


def _drive(ctx: Context, run: Run, claim: Claim, worker_id: str) -> str:
    writer = ctx.writer
    kind = EventKind.RUN_RECOVERED if claim.recovered_from else EventKind.RUN_CLAIMED
    writer.record(kind, {"attempt": run.attempts, "epoch": claim.epoch, "previous_worker": claim.recovered_from},
                  actor=worker_id, durability="exit")
    if claim.recovered_from:
        _recover_spans(ctx)
    try:
        if run.status == RunStatus.COMPENSATING:
            from journal.compensation import compensate_run

            compensate_run(ctx)
            return RunStatus.COMPENSATED
        defn = registry.get_workflow(run.agent)
        from journal.restore import prepare_sandbox

        prepare_sandbox(ctx)  # the sandbox's files back to the latest checkpoint before replay
        from journal.versioning import check_before_resume

        check_before_resume(ctx, defn)
        args = run.input.get("args", [])
        kwargs = run.input.get("kwargs", {})
        output = defn.fn(ctx, *args, **kwargs)
        output = to_json(output, what=f"the return value of workflow {run.agent}")
        return _settle(ctx, RunStatus.COMPLETED, EventKind.RUN_COMPLETED, {"output": output}, output=output,
                       finished_at=timezone.now())
    except Suspend as suspend:
        return _suspend(ctx, suspend)
    except Released as released:
        return _release(ctx, released.reason)
    except LeaseLost:
        log.warning("run %s: lease lost to another worker; stopping without writing", run.id)
        return "lost"
    except Cancelled as cancelled:
        reason = str(cancelled) or run.cancel_reason
        status = _settle(ctx, RunStatus.CANCELLED, EventKind.RUN_CANCELLED, {"reason": reason},
                         error=f"cancelled: {reason}", finished_at=timezone.now())
        from journal.compensation import after_cancel

        after_cancel(ctx)
        return status
    except (NeedsAttention, NondeterminismError, UnknownAgentError) as exc:
        reason = storable_text(exc.reason if isinstance(exc, NeedsAttention) else str(exc))
        details = exc.details if isinstance(exc, NeedsAttention) else {}
        if isinstance(exc, NondeterminismError):
            details = {"position": exc.position, "expected": exc.expected, "got": exc.got}
            writer.record(EventKind.NONDETERMINISM, details, position=None, durability="exit")
        return _settle(ctx, RunStatus.NEEDS_ATTENTION, EventKind.NEEDS_ATTENTION,
                       {"reason": reason, **{k: v for k, v in details.items() if isinstance(v, str | int)}},
                       attention_reason=reason)
    except Exception as exc:
        if writer.lost is not None:
            return "lost"
        error_type, message = exception_text(exc)  # what the workflow raised, made storable (never a stuck run)
        error = f"{error_type}: {message}"
        status = _settle(ctx, RunStatus.FAILED, EventKind.RUN_FAILED,
                         {"error": error, "type": error_type,
                          "traceback": storable_text(traceback.format_exc())[-8000:]},
                         error=error[:10000], error_type=error_type[:200], finished_at=timezone.now())
        from journal.compensation import after_failure

        after_failure(ctx)
        return status


def _recover_spans(ctx: Context) -> None:
    """A dead worker's last spans were still buffered (the trace rides on later writes); rebuild them
    from the journal records, which always made it, so the trace has no hole where the crash was."""
    from datetime import datetime

    from journal.models import TraceSpan
    from journal.replay import span

    traced = TraceSpan.objects.filter(run_id=ctx.run.id, position__isnull=False).order_by("-position") \
        .values_list("position", flat=True).first() or 0
    for position in sorted(p for p in ctx.recorded if p > traced):
        record = ctx.recorded[position]
        payload = record["payload"]
        if "started_at" not in payload:
            continue
        span(ctx, record["step_name"], "effect" if payload.get("kind") == "effect" else "step", position,
             datetime.fromisoformat(payload["started_at"]), float(payload.get("duration_ms", 0)),
             status="error" if "error" in payload else "ok", attempt=payload.get("attempt", 1),
             attributes={"rebuilt_from_journal": True})


def _common_fields(ctx: Context) -> dict[str, Any]:
    fields: dict[str, Any] = {"lease_owner": "", "lease_expires_at": None, "steps": max(ctx.position, ctx.run.steps)}
    if ctx.progress_dirty:
        fields["progress"] = ctx.progress
    if ctx.tokens:
        fields["tokens"] = F("tokens") + ctx.tokens
        fields["cost"] = F("cost") + ctx.cost
        ctx.tokens, ctx.cost = 0, 0.0
    return fields


def _settle(ctx: Context, status: str, event: str, payload: dict, **fields: Any) -> str:
    fields = {**_common_fields(ctx), "status": status, "waiting_for": None, "wake_at": None, **fields}

    def commit() -> None:
        _fenced_update(ctx.run.id, ctx.epoch, **fields)
        from journal.dispatch import after_settle

        after_settle(ctx, status)  # a child's end wakes its parent in the same transaction

    try:
        ctx.writer.record(event, payload, actor=ctx.worker_id, extra=commit)
    except LeaseLost:
        return "lost"
    return status


def _suspend(ctx: Context, suspend: Suspend) -> str:
    waiting = suspend.waiting_for
    fields = {**_common_fields(ctx), "status": RunStatus.SUSPENDED, "waiting_for": waiting, "wake_at": suspend.wake_at}
    final = [RunStatus.SUSPENDED]

    def commit() -> None:
        _fenced_update(ctx.run.id, ctx.epoch, **fields)
        # A signal that arrived after the inbox check but before this commit must not be missed.
        if waiting.get("kind") == "signal" and Signal.objects.filter(
            run_id=ctx.run.id, name=waiting.get("name"), consumed_at__isnull=True
        ).exists():
            Run.objects.filter(id=ctx.run.id, epoch=ctx.epoch).update(status=RunStatus.PENDING)
            final[0] = RunStatus.PENDING
        from journal.dispatch import after_suspend

        after_suspend(ctx, waiting, final)

    try:
        ctx.writer.record(EventKind.SUSPENDED, {"waiting_for": waiting}, actor=ctx.worker_id, extra=commit)
    except LeaseLost:
        return "lost"
    if final[0] == RunStatus.PENDING:
        from journal.dispatch import notify

        notify(ctx.run.id)
    return final[0]


def _release(ctx: Context, reason: str) -> str:
    """Give the run back at a step boundary (shutdown or pause); its journal stays as it is."""
    status = RunStatus.PENDING if ctx.run.status != RunStatus.COMPENSATING else RunStatus.COMPENSATING
    fields = {**_common_fields(ctx), "status": status}
    try:
        if reason == "pause":  # the operator's pause takes effect now; record who asked (journal.operator)
            from journal.operator import record_pause_taken

            record_pause_taken(ctx)
        ctx.writer.record(EventKind.LOG, {"message": f"released by worker ({reason})"}, actor=ctx.worker_id,
                          extra=lambda: _fenced_update(ctx.run.id, ctx.epoch, **fields))
    except LeaseLost:
        return "lost"
    return "released"
