"""The engine's public functions: start runs, signal them, wait for them, cancel them.

Views, the HTTP API, the CLI and tests all come through here; each records the actor.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from journal import registry
from journal.dispatch import notify
from journal.errors import BadArgumentsError, RunNotFoundError, RunStateError, SignalError
from journal.models import (
    TERMINAL_STATUSES,
    AgentPause,
    EventKind,
    Harness,
    Run,
    RunStatus,
    SessionEvent,
    Signal,
)
from journal.serialization import check_text, dumps, to_json

STOPPED_STATUSES = TERMINAL_STATUSES | {RunStatus.NEEDS_ATTENTION}


def _workflow_name(workflow: str | Callable[..., Any]) -> str:
    if isinstance(workflow, str):
        return workflow
    defn = getattr(workflow, "__durable_workflow__", None)
    if defn is None:
        raise BadArgumentsError(f"{workflow!r} is not a @journal.workflow")
    return defn.name


def harness_for(defn: registry.WorkflowDef) -> Harness:
    harness, _ = Harness.objects.get_or_create(
        name=defn.name, version=defn.version, fingerprint=defn.fingerprint,
        defaults={"module": defn.module, "description": defn.description, "durability": defn.durability,
                  "checkpoint_policy": defn.checkpoint},
    )
    return harness


def register_harnesses() -> int:
    """Record every registered workflow version (workers call it at start-up)."""
    for defn in registry.workflows().values():
        harness_for(defn)
    return len(registry.workflows())


def append_event(run_id, kind: str, payload: dict, *, actor: str = "", position: int | None = None,
                 step_name: str = "") -> SessionEvent:
    """Append to the session of a run no worker holds. Call inside a transaction that already
    changed (and so locked) the run row, so no claim can interleave."""
    last = SessionEvent.objects.filter(run_id=run_id).aggregate(m=Max("seq"))["m"] or 0
    return SessionEvent.objects.create(run_id=run_id, seq=last + 1, kind=kind, payload=payload, actor=actor,
                                       position=position, step_name=step_name)


def start_run(workflow: str | Callable[..., Any], args: tuple | list = (), kwargs: dict | None = None, *,
              actor: str = "", parent_id=None, durability: str | None = None,
              checkpoint: str | None = None, run_id=None) -> str:
    """Create a pending run; a worker drives it. Validates everything first: nothing half-written."""
    kwargs = kwargs or {}
    defn = registry.get_workflow(_workflow_name(workflow))
    try:
        inspect.signature(defn.fn).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise BadArgumentsError(f"bad arguments for agent {defn.name!r}: {exc}") from None
    run_input = to_json({"args": list(args), "kwargs": kwargs}, what=f"the input of agent {defn.name}")
    if durability is not None and durability not in registry.DURABILITY_MODES:
        raise BadArgumentsError(f"durability must be one of {registry.DURABILITY_MODES}")
    if checkpoint is not None and checkpoint not in registry.CHECKPOINT_POLICIES:
        raise BadArgumentsError(f"checkpoint must be one of {registry.CHECKPOINT_POLICIES}")
    harness = harness_for(defn)
    frozen = AgentPause.objects.filter(agent=defn.name).first()
    with transaction.atomic():
        run = Run.objects.create(
            **({"paused": True, "paused_by": frozen.paused_by, "pause_reason": f"agent paused: {frozen.reason}"}
               if frozen else {}),
            **({"id": run_id} if run_id else {}),  # a parent records its child's id before creating it
            agent=defn.name, harness=harness, version=defn.version, fingerprint=defn.fingerprint,
            input=run_input, durability=durability or defn.durability,
            checkpoint_policy=checkpoint or defn.checkpoint, created_by=actor, parent_id=parent_id,
        )
        SessionEvent.objects.create(run=run, seq=1, kind=EventKind.RUN_STARTED, actor=actor,
                                    payload={"input": run_input, "version": defn.version,
                                             "fingerprint": defn.fingerprint})
        notify(run.id)
    return str(run.id)


def start(workflow: str | Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Start a run of ``workflow`` with these arguments; returns its run_id at once."""
    return start_run(workflow, args, kwargs)


def get_run(run_id) -> Run:
    try:
        return Run.objects.get(id=run_id)
    except (Run.DoesNotExist, ValueError, TypeError, ValidationError):  # ValidationError: not a UUID
        raise RunNotFoundError(f"no run with id {run_id!r}") from None


def signal(run_id, name: str, payload: Any = None, *, actor: str = "", signal_id: str = "") -> Signal:
    """Deliver a signal durably. Accepted before the run waits (buffered in the inbox);
    idempotent under ``signal_id``; refused for a finished run or a name the agent does not declare."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise SignalError("a signal needs a non-empty name of at most 200 characters")
    check_text(name, what="the signal name")  # NUL or a lone surrogate: refused before any query
    if signal_id:
        check_text(signal_id, what="the signal id", max_length=200)
    run = get_run(run_id)
    if run.status in TERMINAL_STATUSES:
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
            from journal.dispatch import lock_for_wake

            lock_for_wake(run.id)  # else a run suspending right now could miss this signal (PostgreSQL)
            sig = Signal.objects.create(run=run, name=name, payload=payload, actor=actor, signal_id=signal_id)
            woke = Run.objects.filter(
                id=run.id, status=RunStatus.SUSPENDED, waiting_for__kind="signal", waiting_for__name=name
            ).update(status=RunStatus.PENDING, wake_at=None)
            if woke:
                notify(run.id)
    except IntegrityError:
        if signal_id:
            return Signal.objects.get(run=run, signal_id=signal_id)
        raise
    return sig


def wait(run_id, timeout: float = 30) -> Run:
    """Return the run when it stops (finishes or needs attention) or when the timeout passes."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        run = get_run(run_id)
        if time.monotonic() >= deadline:
            return run
        if run.status in STOPPED_STATUSES:
            from journal.compensation import will_compensate

            if not will_compensate(run):  # failed, but its saga is about to start: not finished
                return run
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 0.5)


def cancel(run_id, reason: str = "", *, actor: str = "") -> Run:
    """Cancel a run: at once if no worker holds it, else cooperatively at its next step boundary."""
    run = get_run(run_id)
    if run.status in TERMINAL_STATUSES:
        raise RunStateError(f"run {run.id} is already {run.status}; there is nothing to cancel")
    reason = reason or "cancelled by operator"
    with transaction.atomic():
        stopped = Run.objects.filter(
            id=run.id, status__in=[RunStatus.PENDING, RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION]
        ).update(status=RunStatus.CANCELLED, epoch=run.epoch + 1, finished_at=timezone.now(), lease_owner="",
                 lease_expires_at=None, waiting_for=None, wake_at=None, cancel_requested=True,
                 cancel_reason=reason, cancelled_by=actor, error=f"cancelled: {reason}")
        if stopped:
            append_event(run.id, EventKind.RUN_CANCELLED, {"reason": reason}, actor=actor)
        else:
            if not Run.objects.filter(id=run.id).exclude(status__in=TERMINAL_STATUSES).update(
                    cancel_requested=True, cancel_reason=reason, cancelled_by=actor):
                raise RunStateError(f"run {run.id} finished before it could be cancelled")
    if stopped:
        from journal.compensation import after_cancel_idle

        after_cancel_idle(run.id, actor=actor)
    from journal.children import after_cancel

    after_cancel(run, reason, actor=actor)  # cascade to live children; wake a waiting parent
    return get_run(run.id)


def payload_size(value: Any) -> int:
    return len(dumps(value))
