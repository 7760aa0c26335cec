"""Erasure on request: a subject's data goes, the runs' operational history stays (GDPR article 17).

Retention deletes whole runs by age; erasure keeps each run, its status, its session log's skeleton
(seq, kind, position, step name, actor, time, and the timings, attempts, tokens and costs in the
payloads) and replaces everything the subject's data can live in with a marker:

- the run's input, output, error and free-text reasons;
- step arguments and results in the session log (the only update the append-only log allows,
  ``allow_erasure``; on PostgreSQL the trigger of migration 0006 checks that only payloads change);
- signal payloads, approval prompts, contexts, comments and edited values;
- the effect ledger's arguments, results and errors; checkpoint state and sandbox manifests;
  sandbox commands (command line, output, file names) and the run's sandbox directory on disk;
- trace span attributes and errors; the LangGraph thread of the run (deleted: it is no skeleton);
- the blobs those rows referred to, once nothing else refers to them (a blob shared with another
  subject's run is that run's data too, and stays).

A run is linked to a subject at start (``start_run(..., subject=)``) or by its workflow
(``ctx.set_subject``); children and forks inherit it, and erasing a run erases its forks and
children too (they copied its data). Only finished runs are erased: a run that could still
execute would write the data again or need it (an operator's decision on an effect in doubt).
Everything happens in one transaction: all of it, or, when any run is refused, nothing.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Q

from journal.engine.sandbox_exec import sandbox_base
from journal.models import (
    MARKER_TEXT,
    TERMINAL_STATUSES,
    Approval,
    ApprovalDecision,
    Checkpoint,
    Erasure,
    EventKind,
    LangGraphChannel,
    LangGraphCheckpoint,
    LangGraphWrite,
    Run,
    SandboxCommand,
    SessionEvent,
    SideEffect,
    Signal,
    TraceSpan,
    run_erased,
)
from journal.models.run import subject_is
from journal.models.session import allow_erasure
from journal.store import blobs, runstate
from journal.store.errors import BadArgumentsError, RunNotFoundError, RunStateError
from journal.store.serialization import check_text

log = logging.getLogger(__name__)

__all__ = ["ErasurePreview", "ErasureReport", "erase", "erased_payload", "erasures_of", "preview_erasure",
           "subject_digest"]

MAX_SUBJECT = 200  # Run.subject's length
BATCH = 500  # session events rewritten per bulk update

# What survives in a session event's payload: the skeleton (timings, attempts, tokens, cost, the
# engine's own words), only as scalars. Everything else (arguments, results, messages, payloads,
# anything a workflow chose to log) is replaced.
SKELETON_KEYS = frozenset({
    "kind", "attempt", "started_at", "duration_ms", "latency_ms", "tokens_in", "tokens_out", "cost", "model",
    "finish_reason", "atomic", "epoch", "previous_worker", "timed_out", "will_retry", "checkpoint", "position",
    "idempotency_key", "fencing_token", "policy", "version", "fingerprint", "scope", "action", "due", "deadline",
    "signal", "change_id", "prompt_version", "exit_code", "failure_reason", "truncated", "child_run_id",
    "child_status", "on_expiry", "status", "from_status", "again", "approved", "decided_by", "approver",
    "erased", "erasure_id", "erased_at",
})
FREE_FORM_KINDS = frozenset({EventKind.LOG})  # every key of a log entry is the workflow's own


@dataclass
class RunLine:
    run_id: str
    agent: str
    status: str
    created_at: Any
    events: int = 0
    refused: str = ""  # why this run cannot be erased ("" when it can)
    erased: bool = False  # erased before: skipped


@dataclass
class ErasurePreview:
    """What ``erase`` would do for this selection, computed without writing anything."""

    runs: list[RunLine] = field(default_factory=list)
    events: int = 0  # session events whose payload would be replaced
    files: int = 0  # distinct sandbox files (path in a checkpoint manifest) whose content goes
    blobs: int = 0  # blobs that only these runs refer to: deleted
    blobs_kept: int = 0  # blobs these runs share with other runs: kept
    already_erased: list[Erasure] = field(default_factory=list)  # earlier erasures of this subject

    @property
    def refused(self) -> list[RunLine]:
        return [r for r in self.runs if r.refused]

    @property
    def to_erase(self) -> list[RunLine]:
        return [r for r in self.runs if not r.refused and not r.erased]

    @property
    def ok(self) -> bool:
        return bool(self.to_erase) and not self.refused


@dataclass
class ErasureReport:
    erasure_id: str
    actor: str
    reason: str
    run_ids: list[str]
    events: int
    rows: int
    files: int
    blobs_deleted: int


def subject_digest(subject: str) -> str:
    """The hash an Erasure keeps instead of the subject (whoever knows the subject can find it)."""
    return hashlib.sha256(subject.encode()).hexdigest()


def erased_payload(payload: Any, kind: str, marker: dict) -> dict:
    """A session event's payload with everything but its skeleton replaced by the marker."""
    kept: dict[str, Any] = {}
    if isinstance(payload, dict) and kind not in FREE_FORM_KINDS:
        for key, value in payload.items():
            if key in SKELETON_KEYS and (value is None or isinstance(value, bool | int | float | str)):
                kept[key] = value
        error = payload.get("error")
        if isinstance(error, dict):  # that a step failed, and with what type, is history; the message is data
            kept["error"] = {"type": str(error.get("type", "Error"))[:200], "message": MARKER_TEXT}
        elif isinstance(error, str) and error:
            kept["error"] = MARKER_TEXT
    return {**kept, **marker}


# -- choosing the runs ---------------------------------------------------------------------------

def _selection(run_ids: Iterable[Any] | None, subject: str | None) -> list[uuid.UUID]:
    if run_ids is None and subject is None:
        raise BadArgumentsError("erase needs run_ids= or subject=")
    ids: set[uuid.UUID] = set()
    if subject is not None:
        if not isinstance(subject, str) or not subject.strip() or len(subject) > MAX_SUBJECT:
            raise BadArgumentsError(f"a subject is a non-empty string of at most {MAX_SUBJECT} characters")
        check_text(subject, what="the subject")
        ids |= set(Run.objects.filter(subject_is(subject)).values_list("id", flat=True))
    if run_ids is not None:
        if isinstance(run_ids, str | uuid.UUID):
            run_ids = [run_ids]
        wanted = set()
        for raw in run_ids:
            try:
                wanted.add(raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw).strip()))
            except ValueError:
                raise RunNotFoundError(f"no run with id {raw!r}") from None
        found = set(Run.objects.filter(id__in=wanted).values_list("id", flat=True))
        if wanted - found:
            raise RunNotFoundError(f"no run with id {', '.join(sorted(map(str, wanted - found)))}")
        ids |= found
    # Forks and children copied the data of the runs they came from: they go with them.
    frontier = set(ids)
    while frontier:
        found = set(Run.objects.filter(Q(parent_id__in=frontier) | Q(forked_from_id__in=frontier))
                    .values_list("id", flat=True)) - ids
        ids |= found
        frontier = found
    return sorted(ids)


def _refusal(run: Run) -> str:
    if run.status not in TERMINAL_STATUSES:
        return (f"it is {run.status}: only finished runs ({', '.join(sorted(TERMINAL_STATUSES))}) are erased; "
                "cancel it or let it finish first")
    return ""


def _lines(ids: list[uuid.UUID]) -> list[RunLine]:
    runs = Run.objects.filter(id__in=ids).order_by("created_at", "id")
    counts = dict(SessionEvent.objects.filter(run_id__in=ids).order_by().values("run_id").annotate(
        n=Count("id")).values_list("run_id", "n"))
    return [RunLine(str(r.id), r.agent, r.status, r.created_at, counts.get(r.id, 0), _refusal(r),
                    r.erasure_id is not None) for r in runs]


def _files(ids: list[uuid.UUID]) -> int:
    paths: set[tuple[str, str]] = set()
    for run_id, manifest in Checkpoint.objects.filter(run_id__in=ids).values_list("run_id", "manifest"):
        if isinstance(manifest, dict):
            paths.update((str(run_id), p) for p in manifest)
    return len(paths)


def _blob_split(ids: list[uuid.UUID]) -> tuple[set[str], set[str]]:
    """(blobs only these runs refer to, blobs they share with other runs or threads)."""
    mine = blobs.digests_referenced(runs=ids)
    if not mine:
        return set(), set()
    others = blobs.digests_referenced(excluding=ids)
    return mine - others, mine & others


def preview_erasure(run_ids: Iterable[Any] | None = None, subject: str | None = None) -> ErasurePreview:
    """What ``erase`` would erase and refuse for this selection; writes nothing."""
    ids = _selection(run_ids, subject)
    lines = _lines(ids)
    todo = [uuid.UUID(line.run_id) for line in lines if not line.refused and not line.erased]
    only, shared = _blob_split(todo) if todo else (set(), set())
    events = SessionEvent.objects.filter(run_id__in=todo).count() if todo else 0
    earlier = list(Erasure.objects.filter(subject_sha256=subject_digest(subject))) if subject else []
    return ErasurePreview(runs=lines, events=events, files=_files(todo) if todo else 0, blobs=len(only),
                          blobs_kept=len(shared), already_erased=earlier)


# -- erasing -------------------------------------------------------------------------------------

def _text(value: str) -> str:
    return MARKER_TEXT if value else value


def erase(run_ids: Iterable[Any] | None = None, subject: str | None = None, *, actor: str, reason: str,
          progress: Callable[[int, int], None] | None = None) -> ErasureReport:
    """Erase the data of ``subject``'s runs (or of ``run_ids``), keeping their skeleton; see the module.

    Refused with RunStateError, writing nothing, if any selected run is not finished; runs erased
    before are skipped. ``progress(done, total)`` is called after each run. Returns what was erased.
    """
    if not isinstance(actor, str) or not actor.strip():
        raise BadArgumentsError("erase needs the actor: who asked for it")
    if not isinstance(reason, str) or not reason.strip():
        raise BadArgumentsError("erase needs a reason (e.g. the request's reference): it is kept in the record")
    check_text(actor, what="the actor", max_length=150)
    check_text(reason, what="the reason")
    ids = _selection(run_ids, subject)
    if not ids:
        raise RunNotFoundError(f"no run is linked to subject {subject!r}" if subject else "no run to erase")
    with transaction.atomic():
        locked = Run.objects.filter(id__in=ids).order_by("id")
        if connection.vendor == "postgresql":
            locked = locked.select_for_update()
        runs = list(locked)  # locked: no claim, retry or resume can interleave
        refused = [(r, _refusal(r)) for r in runs if _refusal(r)]
        if refused:
            raise RunStateError("cannot erase: " + "; ".join(f"run {r.id} {why}" for r, why in refused[:10])
                                + (f" (and {len(refused) - 10} more)" if len(refused) > 10 else "")
                                + ". Nothing was erased.")
        todo = [r for r in runs if r.erasure_id is None]
        if not todo:
            raise RunStateError(f"nothing to erase: {'the run was' if len(runs) == 1 else 'the runs were'} "
                                f"erased before (erasure {runs[0].erasure_id})")
        todo_ids = [r.id for r in todo]
        candidates = blobs.digests_referenced(runs=todo_ids)
        files = _files(todo_ids)
        erasure = Erasure.objects.create(actor=actor.strip(), reason=reason.strip(),
                                         subject_sha256=subject_digest(subject) if subject else "",
                                         run_ids=[str(i) for i in todo_ids], runs=len(todo), files=files)
        marker = erasure.marker()
        events = rows = 0
        for done, run in enumerate(todo, 1):
            e, r = _erase_run(run, erasure, marker)
            events += e
            rows += r
            runstate.append_event(run.id, EventKind.OPERATOR_ACTION,
                                  {"action": "erase", "erasure_id": str(erasure.id)}, actor=erasure.actor)
            if progress:
                progress(done, len(todo))
        run_erased.send(sender=Erasure, run_ids=[str(i) for i in todo_ids], erasure=erasure)
        deleted = blobs.collect_garbage(candidates, grace=None) if candidates else 0
        Erasure.objects.filter(id=erasure.id).update(events=events, rows=rows, blobs_deleted=deleted)
        roots = [sandbox_base() / str(i) for i in todo_ids]
        transaction.on_commit(lambda: _remove_directories(roots))
    log.info("erasure %s by %s: %d run(s), %d event(s), %d blob(s) deleted", erasure.id, actor, len(todo),
             events, deleted)
    return ErasureReport(str(erasure.id), erasure.actor, erasure.reason, [str(i) for i in todo_ids], events, rows,
                         files, deleted)


def _erase_run(run: Run, erasure: Erasure, marker: dict) -> tuple[int, int]:
    """Rewrite one run's rows; returns (session events rewritten, other rows rewritten)."""
    progress = run.progress
    if isinstance(progress, dict) and progress.get("label"):
        progress = {**progress, "label": MARKER_TEXT}
    Run.objects.filter(id=run.id).update(
        input=marker, output=marker if run.output is not None else None, error=_text(run.error),
        attention_reason=_text(run.attention_reason), cancel_reason=_text(run.cancel_reason),
        pause_reason=_text(run.pause_reason), progress=progress, subject="", erasure=erasure)
    events = _erase_events(run.id, marker)
    rows = 1
    rows += Signal.objects.filter(run_id=run.id).update(payload=marker, signal_id="")  # a caller's key may quote data
    rows += Approval.objects.filter(run_id=run.id).update(prompt=MARKER_TEXT, context=marker)
    decisions = ApprovalDecision.objects.filter(approval__run_id=run.id)
    rows += decisions.exclude(comment="").update(comment=MARKER_TEXT)
    rows += decisions.filter(edited__isnull=False).update(edited=marker)
    effects = SideEffect.objects.filter(run_id=run.id)
    rows += effects.update(args=marker)
    effects.filter(result__isnull=False).update(result=marker)
    effects.exclude(error="").update(error=MARKER_TEXT)
    effects.filter(compensation_result__isnull=False).update(compensation_result=marker)
    rows += Checkpoint.objects.filter(run_id=run.id).update(manifest={})
    Checkpoint.objects.filter(run_id=run.id, state__isnull=False).update(state=marker)
    for command in SandboxCommand.objects.filter(run_id=run.id):
        SandboxCommand.objects.filter(id=command.id).update(
            command=MARKER_TEXT, argv=[], cwd=_text(command.cwd), stdout=_text(command.stdout),
            stderr=_text(command.stderr), files_created=[MARKER_TEXT] * len(command.files_created or []),
            files_modified=[MARKER_TEXT] * len(command.files_modified or []),
            files_deleted=[MARKER_TEXT] * len(command.files_deleted or []))
        rows += 1
    spans = TraceSpan.objects.filter(run_id=run.id)
    rows += spans.update(attributes=marker)
    spans.exclude(error="").update(error=MARKER_TEXT)
    for model in (LangGraphWrite, LangGraphChannel, LangGraphCheckpoint):
        rows += model.objects.filter(thread_id=str(run.id)).delete()[0]
    return events, rows


def _erase_events(run_id: uuid.UUID, marker: dict) -> int:
    changed = []
    for event in SessionEvent.objects.filter(run_id=run_id).only("id", "kind", "payload").iterator(chunk_size=BATCH):
        new = erased_payload(event.payload, event.kind, marker)
        if new != event.payload:
            event.payload = new
            changed.append(event)
    with allow_erasure():
        for i in range(0, len(changed), BATCH):
            SessionEvent.objects.bulk_update(changed[i:i + BATCH], ["payload"])
    return len(changed)


def _remove_directories(roots: list) -> None:
    """A finished run's sandbox directory holds its files: gone with the erasure (after it commits)."""
    base = sandbox_base().resolve()
    for root in roots:
        path = root.resolve()
        if path.parent == base and path.exists():
            shutil.rmtree(path, ignore_errors=True)


def erasures_of(subject: str) -> list[Erasure]:
    """Earlier erasures of this subject (found by its hash)."""
    return list(Erasure.objects.filter(subject_sha256=subject_digest(subject)))

