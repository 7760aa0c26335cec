"""Drive one claimed run: load its journal, run the workflow from the top, settle the outcome.

The workflow is re-executed on every resume; replay makes the recorded prefix free. The
outcome (completed, failed, suspended, cancelled, needs_attention, or given back) is committed
together with everything still buffered, fenced by the epoch of the claim, through the one
owner of a run's status (``journal.store.runstate``).

Only an exception raised by workflow code fails a run. A database outage in the engine's own calls
(``journal.store.outage``) leaves this module as ``DatabaseUnavailable`` with nothing recorded: the run
stays running under its claim and the worker gives it back.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from journal.driver.replayer import check_before_resume
from journal.driver.saga import after_cancel, after_failure, compensate_run
from journal.driver.settling import end_fields, settle_move
from journal.engine import registry
from journal.engine.checkpoints import edited_state
from journal.engine.history import load_run
from journal.engine.protocol import span
from journal.engine.restore import prepare_sandbox
from journal.models import EventKind, Run, RunStatus, SessionEvent, TraceSpan
from journal.primitives import approvals, children, waits
from journal.primitives.context import Context, _current
from journal.store import summaries
from journal.store.doorbell import notify
from journal.store.errors import (
    Cancelled,
    LeaseLost,
    NeedsAttention,
    NondeterminismError,
    Released,
    StepError,
    Suspend,
    UnknownAgentError,
)
from journal.store.outage import engine_outage, unavailable, workflow_code
from journal.store.serialization import exception_text, storable_text, to_json
from journal.store.writer import JournalWriter

log = logging.getLogger(__name__)

# What a suspension waits for -> the check, inside the suspension's transaction, that wakes the run
# at once when its wait ended while it was still running (a decision made, a child finished).
WAKE_CHECKS: dict[str, Callable[[Context, dict, list], None]] = {
    "signal": waits.after_suspend,
    "approval": approvals.after_suspend,
    "child": children.after_suspend,
}


@dataclass
class Claim:
    run_id: uuid.UUID
    epoch: int
    recovered_from: str = ""  # the worker whose expired lease this claim took over


def drive(claim: Claim, worker_id: str, on_context: Callable[[Context | None], None] | None = None) -> str:
    """Drive a claimed run until it finishes, suspends or is given back; returns the run's status.

    Raises DatabaseUnavailable when the engine's own database calls failed past their retries: nothing
    was recorded about it, the run is still ``running`` under this claim, and the caller gives it back.
    """
    try:
        return _drive_claimed(claim, worker_id, on_context)
    except Exception as exc:
        if engine_outage(exc):  # loading the journal, a read around the workflow: the engine's
            raise unavailable(exc, f"driving run {claim.run_id}") from exc
        raise


def _drive_claimed(claim: Claim, worker_id: str, on_context: Callable[[Context | None], None] | None) -> str:
    run, recorded, markers, last_seq = load_run(claim.run_id)
    if run.epoch != claim.epoch:
        return "lost"
    writer = JournalWriter(run.id, claim.epoch, last_seq + 1, mode=run.durability)
    ctx = Context(run=run, writer=writer, recorded=recorded, markers=markers, worker_id=worker_id,
                  edited_state=edited_state(run))
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
            compensate_run(ctx)
            return RunStatus.COMPENSATED
        defn = registry.get_workflow(run.agent)
        prepare_sandbox(ctx)  # the sandbox's files back to the latest checkpoint before replay
        check_before_resume(ctx, defn)
        args = run.input.get("args", [])
        kwargs = run.input.get("kwargs", {})
        with workflow_code():  # the workflow's body: what escapes it unconverted is the workflow's failure
            output = defn.fn(ctx, *args, **kwargs)
        output = to_json(output, what=f"the return value of workflow {run.agent}")
        return _settle(ctx, RunStatus.COMPLETED, EventKind.RUN_COMPLETED, {"output": output}, output=output,
                       failed_step="", finished_at=timezone.now())
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
        if engine_outage(exc):  # the engine's own call around the workflow (restore, replay check, settle)
            raise unavailable(exc, f"driving run {run.id}") from exc
        error_type, message = exception_text(exc)  # what the workflow raised, made storable (never a stuck run)
        error = f"{error_type}: {message}"
        failed_step = _failed_step(exc)
        status = _settle(ctx, RunStatus.FAILED, EventKind.RUN_FAILED,
                         {"error": error, "type": error_type,
                          "traceback": storable_text(traceback.format_exc())[-8000:]},
                         also=lambda: summaries.record_failed_step(run.id, failed_step),
                         error=error[:10000], error_type=error_type[:200], failed_step=failed_step,
                         finished_at=timezone.now())
        after_failure(ctx)
        return status


def _failed_step(exc: BaseException) -> str:
    """The step a failure came from: the StepError itself, or one the workflow caught and raised
    something else from (``raise Escalation(...) from err``, or while handling it). Empty when the
    workflow's own code failed outside any step."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, StepError):
            return storable_text(cause.step_name)[:200]
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return ""


def _recover_spans(ctx: Context) -> None:
    """A dead worker's last spans were still buffered (the trace rides on later writes); rebuild them
    from the journal records, which always made it, so the trace has no hole where the crash was."""
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


def _settle(ctx: Context, status: str, event: str, payload: dict, *, also: Callable[[], None] | None = None,
            **fields: Any) -> str:
    move = settle_move(ctx, status, **{**end_fields(ctx), "waiting_for": None, "wake_at": None, **fields})

    def commit() -> None:
        move()
        if also is not None:  # more of the run's summary, in the same transaction
            also()
        if ctx.run.parent_id is not None:
            # The last of its group to end wakes its parent, in this same transaction.
            children.wake_parent(ctx.run.parent_id, ctx.run.concurrency_key)

    alone = also is None and ctx.run.parent_id is None  # the move is all: the writer may fold it in
    try:
        ctx.writer.record(event, payload, actor=ctx.worker_id, extra=move if alone else commit)
    except LeaseLost:
        return "lost"
    return status


def _suspend(ctx: Context, suspend: Suspend) -> str:
    waiting = suspend.waiting_for
    move = settle_move(ctx, RunStatus.SUSPENDED, **end_fields(ctx), waiting_for=waiting, wake_at=suspend.wake_at)
    final = [RunStatus.SUSPENDED]

    def commit() -> None:
        final[0] = RunStatus.SUSPENDED  # a retried write decides again
        move()
        check = WAKE_CHECKS.get(waiting.get("kind", ""))
        if check is not None:
            check(ctx, waiting, final)

    try:
        ctx.writer.record(EventKind.SUSPENDED, {"waiting_for": waiting}, actor=ctx.worker_id, extra=commit)
    except LeaseLost:
        return "lost"
    if final[0] == RunStatus.PENDING:
        notify(ctx.run.id)
    return final[0]


def _release(ctx: Context, reason: str) -> str:
    """Give the run back at a step boundary (shutdown or pause); its journal stays as it is."""
    status = RunStatus.PENDING if ctx.run.status != RunStatus.COMPENSATING else RunStatus.COMPENSATING
    move = settle_move(ctx, status, **end_fields(ctx))
    try:
        if reason == "pause":  # the operator's pause takes effect now; record who asked
            record_pause_taken(ctx)
        ctx.writer.record(EventKind.LOG, {"message": f"released by worker ({reason})"}, actor=ctx.worker_id,
                          extra=move)
    except LeaseLost:
        return "lost"
    return "released"


def record_pause_taken(ctx) -> None:
    """A worker releases a run because it was paused: record who paused it (once per pause)."""
    row = Run.objects.filter(id=ctx.run_id).values("paused", "paused_by", "pause_reason").first()
    if not row or not row["paused"]:
        return
    last = (  # released again (e.g. re-claimed after a missed heartbeat): the pause is recorded already
        SessionEvent.objects.filter(run_id=ctx.run_id, kind=EventKind.OPERATOR_ACTION,
                                    payload__action__in=["pause", "unpause"])
        .order_by("-seq").values_list("payload__action", flat=True).first()
    )
    if last != "pause":
        ctx.writer.record(EventKind.OPERATOR_ACTION, {
            "action": "pause", "reason": row["pause_reason"], "from_status": ctx.run.status,
            "taken_at_step": ctx.position}, actor=row["paused_by"], durability="exit")
