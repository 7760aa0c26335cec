"""Time travel: the state of a run at any step, forks from any step, and replay checks.

A step position ("step N") is the 1-based position of a journaled call, as the stepper shows it.
Everything here reads the journal by indexed (run, position) lookups, so the stepper can call
``state_at`` on every click of a 10k-step run; nothing here writes to the run it inspects
(``fork`` writes a new run, the parent is never touched).

``replay_check`` re-executes the *current* workflow code against a recorded journal with every
call stubbed by its record (nothing executes, nothing is written) and reports the first
divergence. ``journal.driver.replayer`` runs the same check before a run resumes on changed code.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.driver.replayer import Divergence, ReplayCheck, replay
from journal.engine import registry
from journal.engine.checkpoints import FORK_STATE, checkpoint_for
from journal.engine.history import History, StepState, state_at, step_total
from journal.models import Checkpoint, CheckpointDecision, EffectStatus, EventKind, Run, SessionEvent, SideEffect
from journal.operations.runs import get_run, refuse_if_erased
from journal.store import blobs, summaries
from journal.store.doorbell import notify
from journal.store.errors import BadArgumentsError
from journal.store.serialization import to_json

__all__ = ["FORK_STATE", "Divergence", "History", "ReplayCheck", "StepState", "blob_texts", "check_runs",
           "export_history", "fork", "replay", "replay_check", "state_at", "step_total"]


def export_history(run_id) -> dict:
    """The run's journal as a self-contained JSON value (``History.to_json``): a golden journal."""
    return History.load(get_run(run_id)).to_json()


def blob_texts(digests: list[str]) -> dict[str, bytes]:
    """The stored contents of sandbox files (by SHA-256), for the stepper's file diffs."""
    return blobs.get_many(digests)

log = logging.getLogger(__name__)

# -- fork --------------------------------------------------------------------------------------

def fork(run_id, at_step: int, *, override: Any = None, state: dict | None = None, actor: str = "",
         reason: str = "") -> str:
    """Start a new run that reuses the parent's results before ``at_step`` and continues live from there.

    With ``override`` the new run also records ``override`` as the result of step ``at_step`` (a
    "what-if": the workflow sees that value instead of executing the step). With ``state`` (a
    dict: LangGraph's ``update_state`` on a past checkpoint, for native runs) the workflow's
    explicit state is ``state`` when step ``at_step`` begins: ``ctx.state`` reads it, and the
    ``set_state`` calls the replayed code makes after step ``at_step - 1`` are superseded by it;
    the edit is a checkpoint of the fork at ``at_step``, read on every execution of the fork, so
    its resumes, recoveries and replay checks see the same state. Both may be given: step
    ``at_step`` then returns ``override`` with ``state`` in place. Effects before the fork point
    are not repeated (their ledger rows are copied, completed); effects after it run under the new
    run's idempotency keys. The sandbox (and, without ``state``, the explicit state) start as the
    parent's checkpoints had them before ``at_step``. The parent is not modified. Returns the new
    run id.
    """
    parent = get_run(run_id)
    refuse_if_erased(parent, "fork")
    if not isinstance(at_step, int) or isinstance(at_step, bool):
        raise BadArgumentsError(f"at_step must be a 1-based step number, not {at_step!r}")
    total = step_total(parent.id)
    if not 1 <= at_step <= total:
        raise BadArgumentsError(
            f"cannot fork run {parent.id} at step {at_step}: it has {total} recorded step(s) (positions 1..{total})"
            if total else f"cannot fork run {parent.id}: it has no recorded steps yet")
    registry.get_workflow(parent.agent)  # the fork must be drivable: fail now, clearly, if the agent is gone
    override_json = to_json(override, what="the override result") if override is not None else None
    if state is not None and not isinstance(state, dict):
        raise BadArgumentsError(f"the edited state must be a JSON object (a dict), not {type(state).__name__}: "
                                "it is what ctx.state returns")
    state_json = to_json(state, what="the edited state") if state is not None else None
    records = History.load(parent).upto(at_step)
    if override is not None and at_step not in records:
        raise BadArgumentsError(f"step {at_step} of run {parent.id} has no recorded result to override")
    copy_upto = at_step if override is not None else at_step - 1
    now = timezone.now()

    with transaction.atomic():
        child = Run.objects.create(
            agent=parent.agent, harness_id=parent.harness_id, version=parent.version,
            fingerprint=parent.fingerprint, input=parent.input, durability=parent.durability,
            checkpoint_policy=parent.checkpoint_policy, forked_from=parent, fork_step=at_step,
            created_by=actor, steps=copy_upto, subject=parent.subject,  # the fork holds the parent's data
        )
        events = [
            SessionEvent(run=child, seq=1, kind=EventKind.RUN_STARTED, actor=actor, created_at=now, payload={
                "input": parent.input, "version": parent.version, "fingerprint": parent.fingerprint,
                "forked_from": str(parent.id), "fork_step": at_step}),
            SessionEvent(run=child, seq=2, kind=EventKind.OPERATOR_ACTION, actor=actor, created_at=now, payload={
                "action": "fork", "forked_from": str(parent.id), "at_step": at_step, "reason": reason,
                "override": override is not None, "state": state is not None}),
        ]
        seq = 2
        for pos in sorted(records):
            if pos > copy_upto:
                continue
            rec = records[pos]
            payload = dict(rec["payload"])
            if pos == at_step and override is not None:
                for key in ("error", "result_ref", "result"):
                    payload.pop(key, None)
                payload.update({"result": override_json, "overridden": True, "overridden_by": actor})
                if state_json is not None:  # the step is called with arguments taken from the edited state
                    payload.pop("args_hash", None)
            seq += 1
            events.append(SessionEvent(run=child, seq=seq, kind=EventKind.STEP_COMPLETED, position=pos,
                                       step_name=rec["step_name"], payload=payload, actor=actor, created_at=now))
        SessionEvent.objects.bulk_create(events, batch_size=500)
        summaries.record_step_names(child.id, {e.step_name for e in events if e.step_name})
        _copy_effects(parent.id, child, copy_upto, at_step, override_json if override is not None else None)
        _copy_checkpoints(parent.id, child, at_step)
        if state_json is not None:
            _write_edited_state(parent.id, child, at_step, state_json, actor)
        notify(child.id)

    log.info("run %s forked from %s at step %s by %s", child.id, parent.id, at_step, actor)
    return str(child.id)


def _copy_effects(parent_id, child: Run, copy_upto: int, at_step: int, override_json: Any) -> None:
    """Effects the fork inherits happened once, in the world, under the parent's keys: the copies are
    settled ledger rows under the fork's own keys, so nothing re-executes and nothing collides."""
    rows = []
    for eff in SideEffect.objects.filter(run_id=parent_id, position__lte=copy_upto):
        result, status = eff.result, eff.status
        if eff.position == at_step and override_json is not None:  # the what-if: recorded as done with this result
            result, status = override_json, EffectStatus.COMPLETED
        rows.append(SideEffect(
            run=child, position=eff.position, step_name=eff.step_name,
            idempotency_key=f"{child.id}:{eff.position}", epoch=0, status=status, args=eff.args,
            result=result, error=eff.error, attempts=eff.attempts, compensation=eff.compensation,
            compensation_result=eff.compensation_result, started_at=eff.started_at,
            completed_at=eff.completed_at, compensated_at=eff.compensated_at,
            resolved_by=eff.resolved_by or f"fork of {parent_id}",
        ))
    SideEffect.objects.bulk_create(rows, batch_size=500)


def _copy_checkpoints(parent_id, child: Run, at_step: int) -> None:
    """Copy the parent's checkpoints before the fork point (delta chains stay whole: their bases
    come earlier). The worker that first claims the fork restores its sandbox from them before
    replaying (journal.engine.restore.prepare_sandbox), so the fork starts with the parent's files at
    step at_step - 1. An explicit empty checkpoint at position 0 stops the lineage lookup from
    reaching the parent's files *after* the fork point when nothing was checkpointed before it."""
    rows = [
        Checkpoint(run=child, position=c.position, step_name=c.step_name, decision=c.decision, reason=c.reason,
                   manifest=c.manifest, state=c.state, bytes_written=0, files_changed=c.files_changed)
        for c in Checkpoint.objects.filter(run_id=parent_id, position__lt=at_step)
    ]
    if not any(r.decision == CheckpointDecision.TAKEN for r in rows):
        rows.append(Checkpoint(run=child, position=0, decision=CheckpointDecision.TAKEN, manifest={}, state=None,
                               reason=f"fork of {parent_id} at step {at_step}: nothing checkpointed before it"))
    Checkpoint.objects.bulk_create(rows, batch_size=500)


def _write_edited_state(parent_id, child: Run, at_step: int, state_json: dict, actor: str) -> None:
    """The edit as a checkpoint of the fork at ``at_step``: the sandbox files as they were before the
    step (the parent's), the state as edited. The context reads it (``edited_state``) on every
    execution; the stepper shows it as the state at the fork step until the step writes its own."""
    before = checkpoint_for(parent_id, at_step - 1) if at_step > 1 else None
    Checkpoint.objects.create(
        run=child, position=at_step, step_name=FORK_STATE, decision=CheckpointDecision.TAKEN,
        reason=f"fork of {parent_id} at step {at_step}: state edited" + (f" by {actor}" if actor else ""),
        manifest=dict(before.manifest) if before is not None else {}, state=state_json, bytes_written=0,
        files_changed=0)


# -- replay check ------------------------------------------------------------------------------

def replay_check(run_id) -> ReplayCheck:
    """Re-execute the current code of the run's agent against its journal; report the first divergence.

    ``.ok`` is True when every recorded call matches (for an unfinished run: so far); otherwise
    ``.divergence`` names the position, what the journal recorded and what the code does now.
    Nothing executes and nothing is written.
    """
    run = get_run(run_id)
    refuse_if_erased(run, "replay-check")
    return replay(History.load(run), registry.get_workflow(run.agent), run=run)


def check_runs(run_ids, progress=None) -> list[ReplayCheck]:
    """Replay-check many runs (``manage.py replay``); ``progress(done, total)`` after each."""
    run_ids = list(run_ids)
    report = []
    for i, run_id in enumerate(run_ids, 1):
        report.append(replay_check(run_id))
        if progress:
            progress(i, len(run_ids))
    return report
