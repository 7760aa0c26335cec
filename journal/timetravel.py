"""Time travel: the state of a run at any step, forks from any step, and replay checks.

A step position ("step N") is the 1-based position of a journaled call, as the stepper shows it.
Everything here reads the journal by indexed (run, position) lookups, so the stepper can call
``state_at`` on every click of a 10k-step run; nothing here writes to the run it inspects
(``fork`` writes a new run, the parent is never touched).

``replay_check`` re-executes the *current* workflow code against a recorded journal with every
call stubbed by its record (nothing executes, nothing is written) and reports the first
divergence. ``journal.versioning`` runs the same check before a run resumes on changed code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from journal import registry
from journal.errors import BadArgumentsError, NondeterminismError
from journal.models import (
    Checkpoint,
    CheckpointDecision,
    EffectStatus,
    EventKind,
    Run,
    RunStatus,
    SessionEvent,
    SideEffect,
    TraceSpan,
)
from journal.serialization import to_json

log = logging.getLogger(__name__)

_RECORD_FIELDS = ("seq", "kind", "position", "step_name", "payload", "actor", "created_at")


def _get_run(run_id) -> Run:
    from journal.api import get_run

    return get_run(run_id)


def _result_of(payload: dict) -> Any:
    if "result_ref" in payload:
        from journal.blobs import load_json

        return load_json(payload["result_ref"])
    return payload.get("result")


def step_total(run_id) -> int:
    """Number of step positions the run has recorded (the stepper's last step).

    Walks the (run, position) index backwards: the last positioned events are almost always the
    last step record (or a wait/effect marker just after it), so this reads a row or two.
    """
    tail = list(SessionEvent.objects.filter(run_id=run_id, position__isnull=False).order_by("-position")
                .values_list("position", "kind")[:8])
    for position, kind in tail:
        if kind == EventKind.STEP_COMPLETED:
            return position
    if not tail:
        return 0
    return (
        SessionEvent.objects.filter(run_id=run_id, position__isnull=False, kind=EventKind.STEP_COMPLETED)
        .aggregate(m=Max("position"))["m"] or 0
    )


# -- state at step N ----------------------------------------------------------------------------

class LazyResults(Mapping):
    """position -> recorded result for positions 1..N, loaded on first access (one query)."""

    def __init__(self, run_id, upto: int):
        self._run_id = run_id
        self._upto = upto
        self._data: dict[int, Any] | None = None

    def _load(self) -> dict[int, Any]:
        if self._data is None:
            rows = (
                SessionEvent.objects.filter(run_id=self._run_id, kind=EventKind.STEP_COMPLETED,
                                            position__isnull=False, position__lte=self._upto)
                .order_by("seq").values_list("position", "payload")
            )
            self._data = {pos: (_result_of(p) if "error" not in p else {"error": p["error"]}) for pos, p in rows}
        return self._data

    def __getitem__(self, position: int) -> Any:
        return self._load()[position]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._load()))

    def __len__(self) -> int:
        return len(self._load())


@dataclass
class StepState:
    """What the stepper shows at step ``position``."""

    position: int
    total: int
    record: dict  # kind, step_name, args, result, error, timings, seq, actor
    results: Mapping  # position -> result for 1..position (lazy)
    state: dict | None  # explicit agent state (ctx.set_state) at this step
    files: dict[str, str]  # sandbox manifest path -> sha256 at this step
    diff: dict  # against position - 1: {"results": ..., "state": ..., "files": ...}
    span: dict | None = None  # the trace span of this step, if any


def _record_at(run_id, position: int) -> dict | None:
    # No ORDER BY (not even the model's default, which joins the run): sorting tempts the planner into
    # the (run, seq) index and a scan of the run; the rows at one position are few (a failure and its
    # retry), so the latest is picked here.
    rows = list(SessionEvent.objects.filter(run_id=run_id, position=position, kind=EventKind.STEP_COMPLETED)
                .order_by().values(*_RECORD_FIELDS))
    if not rows:
        return None
    row = max(rows, key=lambda r: r["seq"])
    payload = row["payload"]
    return {
        "seq": row["seq"], "kind": payload.get("kind", "step"), "event_kind": row["kind"],
        "position": position, "step_name": row["step_name"], "args": payload.get("args"),
        "result": None if "error" in payload else _result_of(payload), "error": payload.get("error"),
        "attempt": payload.get("attempt"), "actor": row["actor"], "recorded_at": row["created_at"],
        "started_at": payload.get("started_at"), "duration_ms": payload.get("duration_ms"),
        "idempotency_key": payload.get("idempotency_key"), "payload": payload,
    }


def _checkpoints(run_id, position: int, cache: dict) -> tuple[Any, dict]:
    """(state, manifest) at ``position``: the latest taken checkpoint at or before it (following
    fork lineage). ``cache`` lets N and N-1 share the decoding when the same checkpoint serves both."""
    if position <= 0:
        return None, {}
    from journal.checkpoints import checkpoint_for, decode_state

    found = checkpoint_for(run_id, position)
    if found is None:
        return None, {}
    if found.pk not in cache:
        cache[found.pk] = (decode_state(found.run_id, found), dict(found.manifest or {}))
    return cache[found.pk]


def _dict_diff(before: dict | None, after: dict | None) -> dict:
    before, after = before or {}, after or {}
    if not isinstance(before, dict) or not isinstance(after, dict):
        return {"added": {}, "removed": [], "changed": {} if before == after else {"": {"from": before, "to": after}}}
    return {
        "added": {k: after[k] for k in after.keys() - before.keys()},
        "removed": sorted(before.keys() - after.keys()),
        "changed": {k: {"from": before[k], "to": after[k]} for k in before.keys() & after.keys()
                    if before[k] != after[k]},
    }


def _files_diff(before: dict, after: dict) -> dict:
    return {
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
        "modified": sorted(k for k in before.keys() & after.keys() if before[k] != after[k]),
    }


def _span_at(run_id, position: int, record: dict) -> dict | None:
    """The step's span, found through the (run, started_at) index: a step's record carries the
    exact start time of its span; others are looked for in the minutes before the record."""
    qs = TraceSpan.objects.filter(run_id=run_id, position=position)
    started = record.get("started_at")
    recorded = record.get("recorded_at")
    if started:
        from django.utils.dateparse import parse_datetime

        qs = qs.filter(started_at=parse_datetime(started))
    elif recorded is not None:
        qs = qs.filter(started_at__gte=recorded - timedelta(minutes=5), started_at__lte=recorded + timedelta(seconds=1))
    else:
        return None
    return (
        qs.order_by("-started_at", "-id")
        .values("span_id", "name", "kind", "status", "error", "attempt", "started_at", "ended_at", "duration_ms",
                "model", "tokens_in", "tokens_out", "cost", "attributes")
        .first()
    )


def state_at(run_id, position: int) -> StepState:
    """The run as it stood after step ``position`` (1-based), with its diff against the step before.

    A handful of indexed queries whatever the journal's length; ``results`` loads lazily.
    """
    try:
        total = step_total(run_id)
    except (ValidationError, ValueError, TypeError):  # not a run id at all
        total = 0
    if total == 0:
        _get_run(run_id)  # RunNotFoundError for an unknown run; the run is only read when it has no steps
    if not isinstance(position, int) or isinstance(position, bool) or not 1 <= position <= max(total, 0):
        raise BadArgumentsError(
            f"step {position!r} is out of range: run {run_id} has {total} step(s) (positions 1..{total})"
            if total else f"run {run_id} has no recorded steps yet")
    record = _record_at(run_id, position) or {"position": position, "kind": "missing", "step_name": "",
                                               "result": None, "error": None, "payload": {}}
    cache: dict = {}
    state, files = _checkpoints(run_id, position, cache)
    prev_state, prev_files = _checkpoints(run_id, position - 1, cache)
    result_diff = {"added": {position: record.get("error") and {"error": record["error"]} or record.get("result")}}
    diff = {"results": result_diff, "state": _dict_diff(prev_state, state), "files": _files_diff(prev_files, files)}
    return StepState(position=position, total=total, record=record, results=LazyResults(run_id, position),
                     state=state, files=files, diff=diff, span=_span_at(run_id, position, record))


# -- fork --------------------------------------------------------------------------------------

def _fork_records(parent_id, at_step: int) -> dict[int, dict]:
    """The parent's effective records (what replay would use) for positions <= at_step."""
    from journal.executor import load_journal

    recorded, _markers, _last = load_journal(parent_id)
    return {pos: rec for pos, rec in recorded.items() if pos <= at_step}


def fork(run_id, at_step: int, *, override: Any = None, actor: str = "", reason: str = "") -> str:
    """Start a new run that reuses the parent's results before ``at_step`` and continues live from there.

    With ``override`` the new run also records ``override`` as the result of step ``at_step`` (a
    "what-if": the workflow sees that value instead of executing the step). Effects before the
    fork point are not repeated (their ledger rows are copied, completed); effects after it run
    under the new run's idempotency keys. The sandbox and explicit state start as the parent's
    checkpoints had them before ``at_step``. The parent is not modified. Returns the new run id.
    """
    parent = _get_run(run_id)
    if not isinstance(at_step, int) or isinstance(at_step, bool):
        raise BadArgumentsError(f"at_step must be a 1-based step number, not {at_step!r}")
    total = step_total(parent.id)
    if not 1 <= at_step <= total:
        raise BadArgumentsError(
            f"cannot fork run {parent.id} at step {at_step}: it has {total} recorded step(s) (positions 1..{total})"
            if total else f"cannot fork run {parent.id}: it has no recorded steps yet")
    registry.get_workflow(parent.agent)  # the fork must be drivable: fail now, clearly, if the agent is gone
    override_json = to_json(override, what="the override result") if override is not None else None
    records = _fork_records(parent.id, at_step)
    if override is not None and at_step not in records:
        raise BadArgumentsError(f"step {at_step} of run {parent.id} has no recorded result to override")
    copy_upto = at_step if override is not None else at_step - 1
    now = timezone.now()

    with transaction.atomic():
        child = Run.objects.create(
            agent=parent.agent, harness_id=parent.harness_id, version=parent.version,
            fingerprint=parent.fingerprint, input=parent.input, durability=parent.durability,
            checkpoint_policy=parent.checkpoint_policy, forked_from=parent, fork_step=at_step,
            created_by=actor, steps=copy_upto,
        )
        events = [
            SessionEvent(run=child, seq=1, kind=EventKind.RUN_STARTED, actor=actor, created_at=now, payload={
                "input": parent.input, "version": parent.version, "fingerprint": parent.fingerprint,
                "forked_from": str(parent.id), "fork_step": at_step}),
            SessionEvent(run=child, seq=2, kind=EventKind.OPERATOR_ACTION, actor=actor, created_at=now, payload={
                "action": "fork", "forked_from": str(parent.id), "at_step": at_step, "reason": reason,
                "override": override is not None}),
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
            seq += 1
            events.append(SessionEvent(run=child, seq=seq, kind=EventKind.STEP_COMPLETED, position=pos,
                                       step_name=rec["step_name"], payload=payload, actor=actor, created_at=now))
        SessionEvent.objects.bulk_create(events, batch_size=500)
        _copy_effects(parent.id, child, copy_upto, at_step, override_json if override is not None else None)
        _copy_checkpoints(parent.id, child, at_step)
        from journal.dispatch import notify

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
    replaying (journal.restore.prepare_sandbox), so the fork starts with the parent's files at
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


# -- replay check ------------------------------------------------------------------------------

@dataclass
class Divergence:
    position: int
    expected: str
    got: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"step {self.position}: the journal recorded {self.expected}, the code now does {self.got}"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class ReplayCheck:
    run_id: str
    ok: bool
    divergence: Divergence | None = None
    checked: int = 0  # positions verified against their records
    recorded: int = 0  # positions the journal holds
    outcome: str = ""  # how the replay ended: "returned", "exhausted", "raised <Type>"
    fingerprint: str = ""  # the code checked
    recorded_fingerprint: str = ""  # the code the run recorded
    notes: list[str] = field(default_factory=list)


class NullWriter:
    """A journal writer that writes nothing: a replay check must leave no trace in the run."""

    lost = None
    writes = 0

    def __init__(self) -> None:
        self.next_seq = 1

    def record(self, *args: Any, extra=None, **kwargs: Any) -> int:
        self.next_seq += 1
        return self.next_seq - 1

    def add_span(self, span: dict) -> None:
        pass

    def barrier(self, extra=None) -> None:
        pass

    def close(self) -> None:
        pass


def replay_in_memory(run: Run, defn: registry.WorkflowDef, recorded: dict, markers: dict) -> ReplayCheck:
    """Run ``defn`` against ``recorded`` with every call stubbed; report the first divergence."""
    from journal.context import Context, _current
    from journal.replay import ReplayExhausted

    ctx = Context(run=run, writer=NullWriter(), recorded=recorded, markers=dict(markers), worker_id="replay-check",
                  replay_only=True)
    result = ReplayCheck(run_id=str(run.id), ok=True, recorded=max(recorded, default=0),
                         fingerprint=defn.fingerprint, recorded_fingerprint=run.fingerprint)
    token = _current.set(ctx)
    try:
        output = defn.fn(ctx, *run.input.get("args", []), **run.input.get("kwargs", {}))
        result.outcome = "returned"
        result.checked = ctx.position
        later = sorted(p for p in recorded if p > ctx.position)
        if later:
            rec = recorded[later[0]]
            result.divergence = Divergence(later[0], rec["step_name"], "return (the workflow now ends earlier)")
        elif run.status == RunStatus.COMPLETED:
            got = to_json(output, what="the replayed output", limit=False)
            if got != run.output:
                result.divergence = Divergence(ctx.position + 1, f"return {_short(run.output)}",
                                               f"return {_short(got)}", "same calls, different output")
    except NondeterminismError as exc:
        result.outcome = "nondeterminism"
        result.checked = exc.position - 1
        result.divergence = Divergence(exc.position, exc.expected, exc.got, "a different call")
    except ReplayExhausted as exc:
        result.outcome = "exhausted"
        result.checked = exc.position - 1
        if run.status == RunStatus.COMPLETED:
            result.divergence = Divergence(exc.position, "the end of the run",
                                           f"a call to {exc.step_name}", "the code makes more calls")
    except Exception as exc:  # the code raised while replaying recorded results
        result.outcome = f"raised {type(exc).__name__}"
        result.checked = ctx.position
        got = f"raise {type(exc).__name__}: {_short(str(exc))}"
        later = sorted(p for p in (*recorded, *markers) if p > ctx.position)
        if later:  # the journal went on past the point where the code now fails
            expected = recorded[later[0]]["step_name"] if later[0] in recorded else "a wait"
            result.divergence = Divergence(later[0], expected, got, "the code now fails on recorded results")
        elif run.status == RunStatus.COMPLETED:
            result.divergence = Divergence(ctx.position + 1, f"return {_short(run.output)}", got,
                                           "the code now fails on recorded results")
        else:  # it failed here before too (or would fail live): no recorded call contradicts it
            result.notes.append(f"the replay ended raising {type(exc).__name__}: {_short(str(exc))}")
    except BaseException as exc:  # Suspend, Cancelled, NeedsAttention...: the code stopped where it would live
        from journal.errors import LeaseLost

        if isinstance(exc, KeyboardInterrupt | SystemExit | LeaseLost):
            raise
        result.outcome = f"stopped ({type(exc).__name__})"
        result.checked = ctx.position
    finally:
        _current.reset(token)
    result.ok = result.divergence is None
    return result


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def replay_check(run_id) -> ReplayCheck:
    """Re-execute the current code of the run's agent against its journal; report the first divergence.

    ``.ok`` is True when every recorded call matches (for an unfinished run: so far); otherwise
    ``.divergence`` names the position, what the journal recorded and what the code does now.
    Nothing executes and nothing is written.
    """
    from journal.executor import load_journal

    run = _get_run(run_id)
    defn = registry.get_workflow(run.agent)
    recorded, markers, _last = load_journal(run.id)
    return replay_in_memory(run, defn, recorded, markers)


def check_runs(run_ids, progress=None) -> list[ReplayCheck]:
    """Replay-check many runs (``manage.py replay``); ``progress(done, total)`` after each."""
    run_ids = list(run_ids)
    report = []
    for i, run_id in enumerate(run_ids, 1):
        report.append(replay_check(run_id))
        if progress:
            progress(i, len(run_ids))
    return report
