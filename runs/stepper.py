"""What the journal stepper shows at step N: the event, the state, the diff against step N-1,
the sandbox files (with file diffs) and the span — read from the journal's tables in a fixed
number of queries whatever N is.

The engine's ``journal.state_at`` is preferred for the agent state when it is available; the rest
is display-only reading of the journal, checkpoint and trace tables (no engine logic: nothing
here decides what may be replayed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max

from journal.models import Checkpoint, CheckpointDecision, EventKind, SessionEvent, TraceSpan
from runs.diffing import Change, json_diff, text_diff


@dataclass
class FileAtStep:
    path: str
    sha256: str
    status: str  # unchanged | added | modified | deleted
    diff: str = ""


@dataclass
class StepView:
    position: int
    total: int
    record: SessionEvent | None
    related: list[SessionEvent] = field(default_factory=list)  # other events at this position
    result: Any = None
    state: Any = None
    changes: list[Change] = field(default_factory=list)
    files: list[FileAtStep] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    span: TraceSpan | None = None

    @property
    def prev(self) -> int | None:
        return self.position - 1 if self.position > 1 else None

    @property
    def next(self) -> int | None:
        return self.position + 1 if self.position < self.total else None


def total_steps(run) -> int:
    recorded = SessionEvent.objects.filter(run=run, kind=EventKind.STEP_COMPLETED).aggregate(m=Max("position"))["m"]
    return max(recorded or 0, 0)


def _result(record: SessionEvent | None) -> Any:
    if record is None:
        return None
    payload = record.payload or {}
    if "error" in payload:
        return {"error": payload["error"]}
    if "result_ref" in payload:
        from journal.store.blobs import load_json

        try:
            return load_json(payload["result_ref"])
        except Exception:  # the blob was purged by retention: say so rather than fail the page
            return {"result_ref": payload["result_ref"], "note": "stored result no longer available"}
    return payload.get("result")


def step_view(run, position: int, total: int | None = None) -> StepView:
    total = total if total is not None else total_steps(run)
    position = max(1, min(position, total or 1))
    events = list(SessionEvent.objects.filter(run=run, position__in=[position - 1, position]).order_by("seq"))
    record = next((e for e in events if e.position == position and e.kind == EventKind.STEP_COMPLETED), None)
    previous = next((e for e in events if e.position == position - 1 and e.kind == EventKind.STEP_COMPLETED), None)
    view = StepView(position=position, total=total, record=record,
                    related=[e for e in events if e.position == position and e is not record],
                    result=_result(record))
    # The last checkpoint taken at or before N, and the one before N (for the diff).
    taken = Checkpoint.objects.filter(run=run, decision=CheckpointDecision.TAKEN)
    cur_cp = taken.filter(position__lte=position).order_by("-position").first()
    prev_cp = taken.filter(position__lt=position).order_by("-position").first()
    view.checkpoint = Checkpoint.objects.filter(run=run, position=position).order_by("-id").first()
    view.state = _engine_state(run, position, cur_cp)
    prev_state = prev_cp.state if prev_cp else None
    view.changes = json_diff({"state": prev_state, "result": _result(previous)},
                             {"state": view.state, "result": view.result})
    view.files = _files(cur_cp, prev_cp, position)
    view.span = TraceSpan.objects.filter(run=run, position=position).order_by("-attempt", "-started_at").first()
    return view


def _engine_state(run, position: int, checkpoint: Checkpoint | None) -> Any:
    import journal
    from journal.engine.checkpoints import decode_state

    try:
        return journal.state_at(run.id, position).state
    except journal.DurableError:  # the engine could not rebuild it: show the checkpoint's own state, decoded
        return decode_state(run.id, checkpoint) if checkpoint else None


def _files(cur: Checkpoint | None, prev: Checkpoint | None, position: int) -> list[FileAtStep]:
    now = dict(cur.manifest or {}) if cur else {}
    before = dict(prev.manifest or {}) if prev else {}
    changed_here = cur is not None and cur.position == position
    out: list[FileAtStep] = []
    wanted: list[str] = []
    for path in sorted(set(now) | set(before)):
        if not changed_here:
            if path in now:
                out.append(FileAtStep(path, str(now[path]), "unchanged"))
            continue
        if path not in before:
            status = "added"
        elif path not in now:
            status = "deleted"
        elif before[path] != now[path]:
            status = "modified"
        else:
            status = "unchanged"
        out.append(FileAtStep(path, str(now.get(path, before.get(path))), status))
        if status != "unchanged":
            wanted += [h for h in (before.get(path), now.get(path)) if isinstance(h, str)]
    if wanted:
        from journal.store.blobs import get_many

        blobs = get_many(wanted)
        for f in out:
            if f.status != "unchanged":
                old, new = before.get(f.path), now.get(f.path)
                f.diff = text_diff(blobs.get(old) if old else None, blobs.get(new) if new else None, f.path)
    return out
