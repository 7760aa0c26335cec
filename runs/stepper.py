"""What the journal stepper shows at step N, built on the engine's history model (``journal.state_at``).

The engine decides what the state at a step is (checkpoints, fork lineage, decoding); this
module only shapes it for the page: the step's own result, the change of *state* since step
N-1 (decoded state against decoded state), and the sandbox files with their text diffs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import journal
from journal.models import Checkpoint, EventKind, SessionEvent
from journal.operations.timetravel import FORK_STATE, blob_texts, step_total
from journal.operations.whatif import model_choices
from runs.diffing import Change, json_diff, text_diff

MODEL_PREFIX = "model:"  # the step name of a model call (journal.primitives.llm)


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
    result: Any = None  # what this step returned (or {"error": ...}): shown as itself, never diffed
    state: Any = None
    changes: list[Change] = field(default_factory=list)  # explicit state, step N-1 -> step N
    files: list[FileAtStep] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    span: dict | None = None
    models: list[str] = field(default_factory=list)  # a model call: the models a what-if can switch it to
    state_edit: dict | None = None  # a state fork's fork step: {"actor", "state"} of the edit it started from

    @property
    def model(self) -> str:
        """The model this step called, when it is a model call."""
        name = self.record.step_name if self.record is not None else ""
        return name.removeprefix(MODEL_PREFIX) if name.startswith(MODEL_PREFIX) else ""

    @property
    def prev(self) -> int | None:
        return self.position - 1 if self.position > 1 else None

    @property
    def next(self) -> int | None:
        return self.position + 1 if self.position < self.total else None


def total_steps(run) -> int:
    """The last step position, as the engine counts it (the header and the stepper agree)."""
    return step_total(run.id)


def step_view(run, position: int, total: int | None = None) -> StepView:
    total = total if total is not None else total_steps(run)
    position = max(1, min(position, total or 1))
    at = journal.state_at(run.id, position)
    events = list(SessionEvent.objects.filter(run=run, position=position).order_by("seq"))
    record = next((e for e in reversed(events) if e.kind == EventKind.STEP_COMPLETED), None)
    view = StepView(position=position, total=at.total, record=record,
                    related=[e for e in events if e is not record], result=at.diff["result"], state=at.state,
                    changes=json_diff(at.previous_state, at.state), span=at.span)
    view.checkpoint = Checkpoint.objects.filter(run=run, position=position).order_by("-id").first()
    view.files = _files(at.previous_files, at.files)
    if run.forked_from_id and position == run.fork_step:
        view.state_edit = _state_edit(run, position)
    if view.model:
        view.models = model_choices(view.model)
    return view


def _state_edit(run, position: int) -> dict | None:
    """The edit a state fork starts from (its checkpoint at the fork step), with who made it."""
    state = (Checkpoint.objects.filter(run=run, position=position, step_name=FORK_STATE).order_by("id")
             .values_list("state", flat=True).first())
    if state is None:
        return None
    actor = (SessionEvent.objects.filter(run=run, seq=2, kind=EventKind.OPERATOR_ACTION)
             .values_list("actor", flat=True).first())
    return {"state": state, "actor": actor or ""}


def _files(before: dict, now: dict) -> list[FileAtStep]:
    out: list[FileAtStep] = []
    wanted: list[str] = []
    for path in sorted(set(now) | set(before)):
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
        texts = blob_texts(wanted)
        for f in out:
            if f.status != "unchanged":
                old, new = before.get(f.path), now.get(f.path)
                f.diff = text_diff(texts.get(old) if old else None, texts.get(new) if new else None, f.path)
    return out
