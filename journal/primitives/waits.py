"""Waiting without a thread: signals and durable timers.

A wait takes a step position. If the journal already holds its outcome, replay returns it.
Otherwise the wait records when it started (so the deadline survives restarts), looks in the
inbox, and if nothing is there raises Suspend: the executor marks the run suspended with what
it waits for and when it must wake, releases the lease and frees the thread.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from journal.engine.protocol import begin
from journal.models import EventKind, RunStatus, Signal
from journal.store import runstate
from journal.store.errors import Suspend, WaitTimeout


def _deadline_marker(ctx, position: int, kind: str, name: str, compute) -> str | None:
    marker = ctx.markers.get(position, {}).get(kind)
    if marker is not None:
        return marker.get("deadline")
    deadline = compute()
    text = deadline.isoformat() if deadline else None
    ctx.writer.record(kind, {"name": name, "deadline": text}, position=position, step_name=name, durability="exit")
    ctx.markers.setdefault(position, {})[kind] = {"deadline": text}
    return text


def wait_for_signal(ctx, name: str, timeout: timedelta | float | None) -> Any:
    step_name = f"signal:{name}"
    position, record = begin(ctx, step_name)
    if record is not None:
        if record["payload"].get("timed_out"):
            raise WaitTimeout(f"no signal {name!r} arrived before the timeout (step {position})")
        return record["payload"].get("result")
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    deadline_text = _deadline_marker(
        ctx, position, EventKind.WAIT_STARTED, step_name,
        lambda: timezone.now() + timedelta(seconds=seconds) if seconds is not None else None)
    signal = (
        Signal.objects.filter(run_id=ctx.run_id, name=name, consumed_at__isnull=True).order_by("created_at", "id")
        .first()
    )
    if signal is not None:
        def consume() -> None:
            Signal.objects.filter(id=signal.id, consumed_at__isnull=True).update(
                consumed_at=timezone.now(), consumed_position=position)

        ctx.writer.record(EventKind.STEP_COMPLETED, {"result": signal.payload, "kind": "signal", "signal": name,
                          "signal_pk": signal.id, "sent_by": signal.actor}, position=position,
                          step_name=step_name, actor=signal.actor, extra=consume)
        return signal.payload
    deadline = datetime.fromisoformat(deadline_text) if deadline_text else None
    if deadline is not None and timezone.now() >= deadline:
        ctx.writer.record(EventKind.STEP_COMPLETED, {"result": None, "timed_out": True, "kind": "signal",
                          "signal": name}, position=position, step_name=step_name, durability="sync")
        raise WaitTimeout(f"no signal {name!r} arrived before the timeout (step {position})")
    raise Suspend({"kind": "signal", "name": name, "position": position, "deadline": deadline_text}, wake_at=deadline)


def sleep(ctx, *, seconds: float | None = None, until: datetime | None = None) -> None:
    position, record = begin(ctx, "sleep")
    if record is not None:
        return
    due_text = _deadline_marker(
        ctx, position, EventKind.TIMER_STARTED, "sleep",
        lambda: until if until is not None else timezone.now() + timedelta(seconds=seconds or 0))
    due = datetime.fromisoformat(due_text)
    now = timezone.now()
    if now >= due:
        ctx.writer.record(EventKind.STEP_COMPLETED, {"result": None, "kind": "timer", "due": due_text,
                          "fired_at": now.isoformat()}, position=position, step_name="sleep", durability="sync")
        return
    raise Suspend({"kind": "timer", "position": position, "deadline": due_text}, wake_at=due)


def after_suspend(ctx, waiting_for: dict, final: list) -> None:
    """Inside the suspension's transaction: a signal that arrived after the inbox check but before
    this commit must not be missed, so it wakes the run at once."""
    arrived = Signal.objects.filter(run_id=ctx.run.id, name=waiting_for.get("name"), consumed_at__isnull=True).exists()
    if arrived and runstate.wake(ctx.run.id, at_epoch=ctx.epoch):
        final[0] = RunStatus.PENDING
