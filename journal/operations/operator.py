"""Operator actions on runs: pause, unpause, retry, resume, and resolving an in-doubt effect.

Each action is a conditional UPDATE of the run row (it only succeeds from the states that allow
it, so two operators racing cannot both act) and an ``operator_action`` session event with the
actor and their reason, committed together. A refused action raises ``RunStateError`` with the
reason and changes nothing.

Events are appended only to runs no worker holds (the worker owns the sequence numbers of a run
it drives). Pausing a running run therefore only sets the flag; the worker's heartbeat releases
the run at its next step boundary, and the pause event is recorded then, with the actor who
asked for it (``journal.driver.executor.record_pause_taken``). Status changes go through
``journal.store.runstate``; pausing changes flags only. A run whose worker died (expired lease) is taken back at
once, its epoch bumped so the dead worker is fenced out.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from journal.engine.protocol import result_payload
from journal.models import (
    AgentPause,
    EffectStatus,
    EventKind,
    Run,
    RunStatus,
    SideEffect,
)
from journal.operations.runs import get_run, refuse_if_erased
from journal.store import runstate
from journal.store.doorbell import notify
from journal.store.errors import BadArgumentsError, RunStateError
from journal.store.serialization import check_text, fingerprint, to_json

HELD_STATUSES = (RunStatus.RUNNING, RunStatus.COMPENSATING)  # a worker may hold these
PAUSABLE_STATUSES = tuple(runstate.IDLE | set(HELD_STATUSES))
# No worker holds these, so an event can be appended to them.
IDLE = Q(status__in=runstate.IDLE) | Q(status=RunStatus.COMPENSATING, lease_owner="")
RESOLUTIONS = ("done", "retry", "skip")


def _refuse(run: Run, action: str, why: str) -> RunStateError:
    return RunStateError(f"cannot {action} run {run.id}: {why}")


def _act(run: Run, action: str, allowed: tuple, changes: dict[str, Any], *, actor: str, reason: str = "",
         extra: dict | None = None, filters: dict | None = None, where: Q | None = None) -> None:
    """Apply ``changes`` (flags, not the status) iff the run is (still) in one of ``allowed``, with its
    operator_action event."""
    with transaction.atomic():
        condition = where if where is not None else Q(status__in=allowed)
        updated = Run.objects.filter(condition, id=run.id, **(filters or {})).update(**changes)
        if updated != 1:
            raise _refused_now(run, action, allowed)
        runstate.append_event(run.id, EventKind.OPERATOR_ACTION,
                              {"action": action, "reason": reason, "from_status": run.status, **(extra or {})},
                              actor=actor)


def _restart(run: Run, action: str, allowed: tuple, *, actor: str, reason: str) -> None:
    """Make a stopped run pending again (retry, resume), with its operator_action event."""
    with transaction.atomic():
        if not runstate.move(run.id, RunStatus.PENDING, cause=runstate.Cause.OPERATOR, sources=allowed,
                             filters={"erasure__isnull": True},  # an erasure that just committed wins
                             event=EventKind.OPERATOR_ACTION, actor=actor,
                             payload={"action": action, "reason": reason, "from_status": run.status}, **_RESTART):
            raise _refused_now(run, action, allowed)


def _refused_now(run: Run, action: str, allowed: tuple) -> RunStateError:
    current = Run.objects.filter(id=run.id).values_list("status", flat=True).first()
    return _refuse(run, action, f"it is {current}, and {action} needs {' or '.join(allowed)}")


# -- pause ------------------------------------------------------------------------------------

def pause(run_id, *, actor: str = "", reason: str = "") -> Run:
    """Freeze a run: no worker claims it, its timers and signals wait until it is unpaused.

    A run a worker holds is released at its next step boundary (the pause is recorded then).
    """
    check_text(reason, what="the reason")
    run = get_run(run_id)
    if run.status not in PAUSABLE_STATUSES:
        raise _refuse(run, "pause", f"it is {run.status}")
    if run.paused:
        raise _refuse(run, "pause", "it is already paused")
    fields = {"paused": True, "paused_by": actor, "pause_reason": reason}
    try:
        _act(run, "pause", PAUSABLE_STATUSES, fields, actor=actor, reason=reason, filters={"paused": False},
             where=IDLE)
    except RunStateError:
        if _take_back_from_dead_worker(run, fields, actor=actor, reason=reason):
            return get_run(run.id)
        # Held by a live worker (or claimed meanwhile): set the flag; it lets go at a step boundary.
        if not Run.objects.filter(id=run.id, status__in=HELD_STATUSES, paused=False).update(**fields):
            raise _refuse(run, "pause", "its state changed meanwhile; look again") from None
    return get_run(run.id)


def _take_back_from_dead_worker(run: Run, fields: dict, *, actor: str, reason: str) -> bool:
    """A held run whose lease expired (its worker died): pause it at once. Bumping the epoch fences
    out the dead worker should it come back, so the pause event can be appended safely."""
    now = timezone.now()
    with transaction.atomic():
        expired = Run.objects.filter(id=run.id, status__in=HELD_STATUSES, paused=False, lease_expires_at__lt=now)
        taken = runstate.move(run.id, RunStatus.PENDING, cause=runstate.Cause.OPERATOR, sources=(RunStatus.RUNNING,),
                              filters={"paused": False, "lease_expires_at__lt": now}, lease_owner="",
                              lease_expires_at=None, epoch=F("epoch") + 1, **fields)
        taken += expired.filter(status=RunStatus.COMPENSATING).update(
            lease_owner="", lease_expires_at=None, epoch=F("epoch") + 1, **fields)
        if taken:
            runstate.append_event(run.id, EventKind.OPERATOR_ACTION, {
                "action": "pause", "reason": reason, "from_status": run.status,
                "note": f"its worker {run.lease_owner or '?'} had stopped renewing its lease"}, actor=actor)
    return bool(taken)


def unpause(run_id, *, actor: str = "", reason: str = "") -> Run:
    """Let a paused run be claimed again; a due timer or a buffered signal wakes it at once."""
    run = get_run(run_id)
    if not run.paused:
        raise _refuse(run, "unpause", "it is not paused")
    if run.status in runstate.TERMINAL:
        raise _refuse(run, "unpause", f"it is {run.status}")
    fields = {"paused": False, "paused_by": "", "pause_reason": ""}
    try:
        _act(run, "unpause", PAUSABLE_STATUSES, fields, actor=actor, reason=reason, filters={"paused": True},
             where=IDLE)
    except RunStateError:
        # Still held: the pause has not taken effect yet; withdrawing it leaves nothing to record.
        if not Run.objects.filter(id=run.id, status__in=HELD_STATUSES, paused=True).update(**fields):
            raise _refuse(run, "unpause", "its state changed meanwhile; look again") from None
    notify(run.id)
    return get_run(run.id)


def pause_agent(agent: str, *, actor: str = "", reason: str = "") -> int:
    """Freeze ``agent`` (an incident): pause every live run, and runs started meanwhile start paused.

    Returns how many live runs were paused."""
    if not isinstance(agent, str) or not agent.strip() or len(agent) > 200:
        raise BadArgumentsError("an agent name is 1 to 200 characters")
    check_text(agent, what="the agent name")
    check_text(reason, what="the reason")
    AgentPause.objects.update_or_create(agent=agent, defaults={"paused_by": actor, "reason": reason})
    count = 0
    for run_id in Run.objects.filter(agent=agent, status__in=PAUSABLE_STATUSES, paused=False).values_list(
            "id", flat=True):
        try:
            pause(run_id, actor=actor, reason=reason)
            count += 1
        except RunStateError:  # finished meanwhile
            continue
    return count


def unpause_agent(agent: str, *, actor: str = "", reason: str = "") -> int:
    """Lift the freeze on ``agent`` and unpause its paused runs; returns how many were unpaused."""
    AgentPause.objects.filter(agent=agent).delete()
    count = 0
    for run_id in Run.objects.filter(agent=agent, paused=True).exclude(status__in=runstate.TERMINAL).values_list(
            "id", flat=True):
        try:
            unpause(run_id, actor=actor, reason=reason)
            count += 1
        except RunStateError:
            continue
    return count


# -- retry and resume -------------------------------------------------------------------------

_RESTART = {"error": "", "error_type": "", "attention_reason": "",
            "finished_at": None, "lease_owner": "", "lease_expires_at": None, "waiting_for": None, "wake_at": None}


def _in_doubt_positions(run_id) -> list[int]:
    return list(SideEffect.objects.filter(run_id=run_id, status=EffectStatus.STARTED).values_list(
        "position", flat=True))


def retry(run_id, *, actor: str = "", reason: str = "") -> Run:
    """Run a failed or needs_attention run again from its failure point.

    The recorded failure is superseded (the step re-executes; a failed effect retries under the
    same key); everything recorded before it replays.
    """
    run = get_run(run_id)
    refuse_if_erased(run, "retry")
    allowed = (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)
    if run.status not in allowed:
        raise _refuse(run, "retry", f"it is {run.status}; only a failed or needs_attention run can be retried")
    doubt = _in_doubt_positions(run.id)
    if doubt:
        raise _refuse(run, "retry", f"the effect at step {doubt[0]} is in doubt: resolve it first "
                                    "(mark it done, retry it with the same key, or skip it)")
    _restart(run, "retry", allowed, actor=actor, reason=reason)
    notify(run.id)
    return get_run(run.id)


def resume(run_id, *, actor: str = "", reason: str = "") -> Run:
    """Resume a needs_attention run as it stands (e.g. after compatible code was deployed)."""
    run = get_run(run_id)
    refuse_if_erased(run, "resume")
    if run.status != RunStatus.NEEDS_ATTENTION:
        raise _refuse(run, "resume", f"it is {run.status}; only a needs_attention run can be resumed")
    doubt = _in_doubt_positions(run.id)
    if doubt:
        raise _refuse(run, "resume", f"the effect at step {doubt[0]} is in doubt: resolve it first "
                                     "(mark it done, retry it with the same key, or skip it)")
    _restart(run, "resume", (RunStatus.NEEDS_ATTENTION,), actor=actor, reason=reason)
    notify(run.id)
    return get_run(run.id)


# -- in-doubt effects -------------------------------------------------------------------------

def resolve_effect(run_id, position: int, *, action: str, result: Any = None, actor: str = "",
                   comment: str = "") -> Run:
    """Decide an effect that started but whose outcome was never recorded, then let the run go on.

    ``done``: it happened; ``result`` is recorded as its result. ``retry``: execute it once more
    under the same idempotency key. ``skip``: it did not happen and must not; the step returns None.
    """
    if action not in RESOLUTIONS:
        raise BadArgumentsError(f"action must be one of {', '.join(RESOLUTIONS)}, not {action!r}")
    if action != "done" and result is not None:
        raise BadArgumentsError("a result can be given only with action='done'")
    result_json = to_json(result, what="the effect's result") if action == "done" else None
    run = get_run(run_id)
    verb = f"resolve the effect at step {position} of"
    if run.status != RunStatus.NEEDS_ATTENTION:
        raise _refuse(run, verb, f"it is {run.status}; effects are resolved on a needs_attention run")
    effect = SideEffect.objects.filter(run_id=run.id, position=position).first()
    if effect is None:
        raise _refuse(run, verb, f"step {position} is not an effect")
    if effect.status != EffectStatus.STARTED:
        raise _refuse(run, verb, f"that effect is {effect.status}, not in doubt")
    now = timezone.now()
    with transaction.atomic():
        if not runstate.move(run.id, RunStatus.PENDING, cause=runstate.Cause.OPERATOR,
                             sources=(RunStatus.NEEDS_ATTENTION,), **_RESTART):
            raise _refuse(run, verb, "its state changed meanwhile; look again")
        new_status = {"done": EffectStatus.COMPLETED, "skip": EffectStatus.SKIPPED, "retry": EffectStatus.STARTED}
        changes: dict[str, Any] = {"status": new_status[action], "resolved_by": actor}
        if action != "retry":
            changes.update(result=result_json, completed_at=now)
        if SideEffect.objects.filter(id=effect.id, status=EffectStatus.STARTED).update(**changes) != 1:
            raise _refuse(run, verb, "the effect was resolved meanwhile")
        runstate.append_event(run.id, EventKind.OPERATOR_ACTION, {
            "action": "resolve_effect", "resolution": action, "position": position, "comment": comment,
            "reason": comment, "from_status": run.status, "idempotency_key": effect.idempotency_key,
            "step": effect.step_name}, actor=actor)
        if action != "retry":
            payload = {**result_payload(result_json), "kind": "effect", "idempotency_key": effect.idempotency_key,
                       "resolved_by": actor, "resolution": action}
            if not effect.args.get("truncated"):
                payload.update(args=effect.args, args_hash=fingerprint(effect.args))
            runstate.append_event(run.id, EventKind.STEP_COMPLETED, payload, actor=actor, position=position,
                         step_name=effect.step_name)
    notify(run.id)
    return get_run(run.id)
