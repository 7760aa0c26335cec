"""The engine's public functions: start runs, signal them, wait for them, cancel them.

Views, the HTTP API, the CLI and tests all come through here; each records the actor.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from journal.driver.saga import after_cancel_idle, has_effects_to_undo, will_compensate
from journal.engine import registry
from journal.engine.history import read_run
from journal.engine.launch import harness_for, register_harnesses, start_run
from journal.models import EffectStatus, EventKind, Run, RunStatus, SideEffect, Signal
from journal.primitives.children import wake_parent
from journal.store import runstate
from journal.store.doorbell import notify, watch
from journal.store.errors import BadArgumentsError, RunNotFoundError, RunStateError, SignalError
from journal.store.serialization import check_text, dumps, to_json

__all__ = ["allowed_actions", "cancel", "get_run", "harness_for", "payload_size", "refusal", "register_harnesses",
           "refuse_if_erased", "signal", "start", "start_run", "wait"]


def start(workflow: str | Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Start a run of ``workflow`` with these arguments; returns its run_id at once."""
    return start_run(workflow, args, kwargs)


def refuse_if_erased(run: Run, what: str) -> None:
    """An erased run's journal keeps its skeleton, not the data a replay, fork or retry needs."""
    if run.erasure_id:
        raise RunStateError(f"cannot {what} run {run.id}: its data was erased (erasure {run.erasure_id}); "
                            "its journal keeps only positions, step names and timings")


def get_run(run_id) -> Run:
    """The run with this id (a UUID, its text, or its integer, as the ORM takes them), else RunNotFoundError."""
    try:
        key = run_id if isinstance(run_id, uuid.UUID) else (
            uuid.UUID(int=run_id) if isinstance(run_id, int) else uuid.UUID(str(run_id)))
    except (ValueError, TypeError, AttributeError):
        key = None
    run = read_run(key) if key is not None else None
    if run is None:
        raise RunNotFoundError(f"no run with id {run_id!r}")
    return run


def signal(run_id, name: str, payload: Any = None, *, actor: str = "", signal_id: str = "") -> Signal:
    """Deliver a signal durably. Accepted before the run waits (buffered in the inbox);
    idempotent under ``signal_id``; refused for a finished run or a name the agent does not declare."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise SignalError("a signal needs a non-empty name of at most 200 characters")
    check_text(name, what="the signal name")  # NUL or a lone surrogate: refused before any query
    if signal_id:
        check_text(signal_id, what="the signal id", max_length=200)
    run = get_run(run_id)
    if run.status in runstate.TERMINAL:
        raise SignalError(f"run {run.id} is {run.status}; it accepts no more signals")
    try:
        defn = registry.get_workflow(run.agent)
    except Exception:
        defn = None
    declared = defn.options.get("signals") if defn else None
    if declared and name not in declared:
        raise SignalError(f"agent {run.agent!r} does not wait for a signal named {name!r} "
                          f"(it declares: {', '.join(declared)})")
    payload = to_json(payload, what="the signal payload")
    if signal_id:
        existing = Signal.objects.filter(run=run, signal_id=signal_id).first()
        if existing is not None:
            return existing
    try:
        with transaction.atomic():
            runstate.lock_for_wake(run.id)  # else a run suspending right now could miss this signal (PostgreSQL)
            sig = Signal.objects.create(run=run, name=name, payload=payload, actor=actor, signal_id=signal_id)
            if runstate.wake(run.id, waiting_for={"kind": "signal", "name": name}):
                notify(run.id)
    except IntegrityError:
        if signal_id:
            return Signal.objects.get(run=run, signal_id=signal_id)
        raise
    return sig


def wait(run_id, timeout: float = 30) -> Run:
    """Return the run when it stops (finishes or needs attention) or when the timeout passes.

    A run driven by a worker of this process is read again as soon as that drive ends (the doorbell);
    one driven elsewhere is polled, every 20 ms at first and at most every half second."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    with watch(run_id) as ended:
        while True:
            run = get_run(run_id)
            if time.monotonic() >= deadline:
                return run
            if run.status in runstate.STOPPED and not will_compensate(run):
                return run  # (a failed run whose saga is about to start is not finished)
            if ended.wait(min(delay, max(0.0, deadline - time.monotonic()))):
                ended.clear()
            else:
                delay = min(delay * 1.5, 0.5)


def cancel(run_id, reason: str = "", *, actor: str = "") -> Run:
    """Cancel a run: at once if no worker holds it, else cooperatively at its next step boundary.

    Cancelling a run cancels its live children; a child cancelled on its own wakes its parent.
    """
    run = get_run(run_id)
    if run.status in runstate.TERMINAL:
        raise RunStateError(f"run {run.id} is already {run.status}; there is nothing to cancel")
    check_text(reason or "", what="the reason")
    reason = reason or "cancelled by operator"
    with transaction.atomic():
        stopped = runstate.move(
            run.id, RunStatus.CANCELLED, cause=runstate.Cause.OPERATOR, sources=runstate.IDLE,
            event=EventKind.RUN_CANCELLED, payload={"reason": reason}, actor=actor,
            epoch=run.epoch + 1, finished_at=timezone.now(), lease_owner="", lease_expires_at=None,
            waiting_for=None, wake_at=None, cancel_requested=True, cancel_reason=reason, cancelled_by=actor,
            error=f"cancelled: {reason}")
        if not stopped and not Run.objects.filter(id=run.id).exclude(status__in=runstate.TERMINAL).update(
                cancel_requested=True, cancel_reason=reason, cancelled_by=actor):
            raise RunStateError(f"run {run.id} finished before it could be cancelled")
    if stopped:
        after_cancel_idle(run.id, actor=actor)
    for child_id in Run.objects.filter(parent_id=run.id).exclude(status__in=runstate.TERMINAL).values_list(
            "id", flat=True):
        try:
            cancel(child_id, f"parent run {run.id} was cancelled: {reason or 'no reason given'}", actor=actor)
        except RunStateError:
            pass  # it finished meanwhile
    if run.parent_id is not None:
        wake_parent(run.parent_id, run.concurrency_key)
    return get_run(run.id)


ACTIONS = ("cancel", "signal", "pause", "unpause", "resume", "retry", "compensate")


def refusal(run: Run, action: str) -> str:
    """Why the engine would refuse ``action`` on ``run`` as it stands ("" when it would accept it), from the
    same checks the actions make: their status sets, the saga's effects to undo, effects in doubt."""
    status = run.status
    if action not in ACTIONS:
        raise BadArgumentsError(f"unknown action {action!r}; actions: {', '.join(ACTIONS)}")
    if run.erasure_id and action in ("resume", "retry", "compensate"):
        return "its data was erased"
    if action in ("cancel", "signal", "pause", "unpause"):
        if status in runstate.TERMINAL:
            return f"it is {status}"
        if action == "pause" and run.paused:
            return "it is already paused"
        if action == "unpause" and not run.paused:
            return "it is not paused"
        return ""
    allowed = {"resume": (RunStatus.NEEDS_ATTENTION,), "retry": (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION),
               "compensate": tuple(runstate.COMPENSABLE)}[action]
    if status not in allowed:
        return f"it is {status}"
    if action == "compensate":
        return "" if has_effects_to_undo(run.id) else "it has no completed effect with a compensation to undo"
    doubt = SideEffect.objects.filter(run_id=run.id, status=EffectStatus.STARTED).values_list(
        "position", flat=True).first()
    return f"the effect at step {doubt} is in doubt: resolve it first" if doubt is not None else ""


def allowed_actions(run: Run) -> frozenset[str]:
    """The operator actions the engine would accept for ``run`` now (names as in ``ACTIONS``), so a page
    offers only those. Fork, re-run and the replay check read the journal and work in any state.
    A race can still refuse one: each action checks again."""
    return frozenset(a for a in ACTIONS if not refusal(run, a))


def payload_size(value: Any) -> int:
    return len(dumps(value))
