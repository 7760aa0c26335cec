"""The history model: a run's journal as a value, and the state of a run at any step.

``History`` is what replay consumes: the effective records by position (what a resumed run,
a fork, a replay check and versioning replay against), the wait/child/approval markers and
the run's input and outcome. It loads from the database (``History.load``) or from JSON
(``History.from_json``, the golden journals of ``tests/golden/``), so the same value feeds the
executor, the in-memory replayer, the deploy gate (``manage.py replay``) and regression tests.

``state_at`` is the stepper's view of step N: the record, the explicit state and sandbox
manifest from the checkpoints (following fork lineage), and the change from step N-1, read by
indexed (run, position) lookups so a click on a 10k-step run costs a handful of queries.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Max, OuterRef, Q, Subquery
from django.utils.dateparse import parse_datetime

from journal.engine.checkpoints import checkpoint_for, decode_state, edited_state
from journal.engine.protocol import result_of
from journal.models import EventKind, Run, SessionEvent, TraceSpan
from journal.store import frozen
from journal.store.errors import BadArgumentsError, RunNotFoundError

MARKER_KINDS = (EventKind.WAIT_STARTED, EventKind.TIMER_STARTED, EventKind.APPROVAL_REQUESTED, EventKind.CHILD_STARTED)
HISTORY_FORMAT = 1  # bump when the JSON shape changes


# An operator's retry: replay runs past the failures recorded before it (the journal's second mark).
_RETRY = Q(kind=EventKind.OPERATOR_ACTION, payload__action="retry")

# Every drive of every run loads its journal: both queries compile once (journal.store.frozen).
_POSITIONED = frozen.FrozenQuery(
    SessionEvent, ("seq", "kind", "position", "step_name", "payload"),
    lambda _v, run_id: SessionEvent.objects.filter(run_id=run_id, position__isnull=False).order_by("seq")
    .values("seq", "kind", "position", "step_name", "payload"), run_id=frozen.SENTINEL_UUID)
_MARKS = frozen.FrozenQuery(
    SessionEvent, ("last", "retry"),
    lambda _v, run_id: SessionEvent.objects.filter(run_id=run_id).order_by().values("run_id").annotate(
        last=Max("seq"), retry=Max("seq", filter=_RETRY))
    .values("last", "retry"), run_id=frozen.SENTINEL_UUID)


def _seq_of(events) -> Subquery:
    return Subquery(events.order_by().values("run_id").annotate(m=Max("seq")).values("m")[:1])


_RUN_FIELDS = tuple(f.attname for f in Run._meta.concrete_fields)
# A claimed run's row with its journal's two marks (the last seq, the last operator retry's) as
# scalar subqueries on the (run, seq) index: what a drive reads first, in one statement.
_RUN_AND_MARKS = frozen.FrozenQuery(
    Run, (*_RUN_FIELDS, "journal_last_seq", "journal_retry_seq"),
    lambda _v, pk: Run._base_manager.filter(pk=pk).annotate(
        journal_last_seq=_seq_of(SessionEvent.objects.filter(run_id=OuterRef("pk"))),
        journal_retry_seq=_seq_of(SessionEvent.objects.filter(_RETRY, run_id=OuterRef("pk"))),
    ).values(*_RUN_FIELDS, "journal_last_seq", "journal_retry_seq"), pk=frozen.SENTINEL_UUID)


_RUN = frozen.FrozenQuery(Run, _RUN_FIELDS, lambda _v, pk: Run._base_manager.filter(pk=pk).values(*_RUN_FIELDS),
                          pk=frozen.SENTINEL_UUID)


def read_run(run_id: uuid.UUID) -> Run | None:
    """The run's row, or None: ``Run.objects.get`` with its SQL compiled once. ``journal.wait`` reads
    it at every look and the pages and the API at every request; compiling it was most of the read."""
    rows = _RUN.rows(pk=run_id)
    return _run_of(rows[0]) if rows else None


def _run_of(row: dict) -> Run:
    """The model instance of a row read with ``_RUN_FIELDS``, as the ORM would build it."""
    return Run.from_db(Run.objects.db, _RUN_FIELDS, [row[name] for name in _RUN_FIELDS])


def load_run(run_id) -> tuple[Run, dict, dict, int]:
    """(the run, its records by position, its markers by position, the last seq) for a drive.

    One statement for a fresh run, whose only event is ``run_started``; two for any other (its
    positioned events follow). ``load_journal`` reads the same journal for a run already in hand.
    """
    rows = _RUN_AND_MARKS.rows(pk=run_id)
    if not rows:
        raise Run.DoesNotExist(f"Run matching query does not exist: {run_id}")
    row = rows[0]
    run = _run_of(row)
    last_seq, retry_seq = row["journal_last_seq"] or 0, row["journal_retry_seq"] or 0
    recorded, markers = _replayable(_POSITIONED.rows(run_id=run_id) if last_seq > 1 else [], retry_seq)
    return run, recorded, markers, last_seq


def load_journal(run_id) -> tuple[dict, dict, int]:
    """Return (records by position, wait/timer markers by position, last seq): what replay uses.

    A failed record before an operator's retry is skipped (the retry asked to run past it), and
    so are markers before it (the waits begin again).
    """
    rows = _POSITIONED.rows(run_id=run_id)
    marks = _MARKS.rows(run_id=run_id)
    retry_seq, last_seq = (marks[0]["retry"] or 0, marks[0]["last"] or 0) if marks else (0, 0)
    recorded, markers = _replayable(rows, retry_seq)
    return recorded, markers, last_seq


def _replayable(rows: list[dict], retry_seq: int) -> tuple[dict, dict]:
    """(records by position, markers by position) from a run's positioned events, as replay reads them."""
    recorded: dict[int, dict] = {}
    markers: dict[int, dict] = {}
    for row in rows:
        seq, kind, position, step_name, payload = (row["seq"], row["kind"], row["position"], row["step_name"],
                                                   row["payload"])
        if kind == EventKind.STEP_COMPLETED:
            if "error" in payload and seq < retry_seq:
                continue  # an operator asked to retry past this failure
            recorded[position] = {"seq": seq, "kind": kind, "step_name": step_name, "payload": payload}
        elif kind in MARKER_KINDS and seq > retry_seq:
            markers.setdefault(position, {})[kind] = payload
    return recorded, markers


@dataclass
class History:
    """A run's journal as replay sees it, detached from the database once loaded."""

    run_id: str
    workflow: str  # the registered name (Run.agent)
    input: dict  # {"args": [...], "kwargs": {...}}
    records: dict[int, dict]  # position -> {"seq", "kind", "step_name", "payload"}: what replay returns
    markers: dict[int, dict] = field(default_factory=dict)  # position -> {kind: payload} for waits, children
    last_seq: int = 0
    status: str = ""
    output: Any = None
    fingerprint: str = ""  # the code the run recorded its steps with
    version: str = ""
    epoch: int = 0
    durability: str = "sync"
    edited_state: dict[int, dict] = field(default_factory=dict)  # a state fork: step -> the state seen there

    @classmethod
    def load(cls, run: Run) -> History:
        records, markers, last_seq = load_journal(run.id)
        return cls(run_id=str(run.id), workflow=run.agent, input=run.input or {}, records=records, markers=markers,
                   last_seq=last_seq, status=run.status, output=run.output, fingerprint=run.fingerprint,
                   version=run.version, epoch=run.epoch, durability=run.durability, edited_state=edited_state(run))

    @property
    def total(self) -> int:
        """The last recorded position."""
        return max(self.records, default=0)

    def upto(self, position: int) -> dict[int, dict]:
        """The records at positions 1..position (what a fork from position + 1 reuses)."""
        return {pos: rec for pos, rec in self.records.items() if pos <= position}

    def result_at(self, position: int) -> Any:
        record = self.records.get(position)
        if record is None:
            return None
        payload = record["payload"]
        return {"error": payload["error"]} if "error" in payload else result_of(payload)

    def as_run(self) -> Run:
        """An unsaved Run carrying what a replay reads from it; nothing is written."""
        return Run(id=self.run_id, agent=self.workflow, input=self.input, status=self.status, output=self.output,
                   fingerprint=self.fingerprint, version=self.version, epoch=self.epoch, durability=self.durability)

    def to_json(self) -> dict:
        """A self-contained value: results kept in the blob store are inlined."""
        records = {}
        for pos, rec in sorted(self.records.items()):
            payload = dict(rec["payload"])
            if "result_ref" in payload:
                payload["result"] = result_of(payload)
                del payload["result_ref"]
            records[str(pos)] = {**rec, "payload": payload}
        return {"format": HISTORY_FORMAT, "run_id": self.run_id, "workflow": self.workflow, "input": self.input,
                "status": self.status, "output": self.output, "fingerprint": self.fingerprint,
                "version": self.version, "last_seq": self.last_seq, "records": records,
                "markers": {str(pos): m for pos, m in sorted(self.markers.items())},
                **({"edited_state": {str(pos): st for pos, st in sorted(self.edited_state.items())}}
                   if self.edited_state else {})}

    @classmethod
    def from_json(cls, data: str | bytes | dict) -> History:
        if not isinstance(data, dict):
            data = json.loads(data)
        if data.get("format") != HISTORY_FORMAT:
            raise BadArgumentsError(f"not a history in format {HISTORY_FORMAT}: {data.get('format')!r}")
        return cls(run_id=data["run_id"], workflow=data["workflow"], input=data.get("input") or {},
                   records={int(pos): rec for pos, rec in data.get("records", {}).items()},
                   markers={int(pos): m for pos, m in data.get("markers", {}).items()},
                   last_seq=int(data.get("last_seq", 0)), status=data.get("status", ""), output=data.get("output"),
                   fingerprint=data.get("fingerprint", ""), version=data.get("version", ""),
                   edited_state={int(pos): st for pos, st in (data.get("edited_state") or {}).items()})


def _require_run(run_id) -> None:
    try:
        found = Run.objects.filter(id=run_id).exists()
    except (ValueError, TypeError, ValidationError):  # ValidationError: not a UUID
        found = False
    if not found:
        raise RunNotFoundError(f"no run with id {run_id!r}")


_RECORD_FIELDS = ("seq", "kind", "position", "step_name", "payload", "actor", "created_at")


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
            self._data = {pos: (result_of(p) if "error" not in p else {"error": p["error"]}) for pos, p in rows}
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
    diff: dict  # against position - 1: {"result": ..., "state": ..., "files": ...}
    span: dict | None = None  # the trace span of this step, if any
    previous_state: dict | None = None  # the state after step position - 1 (what ``diff["state"]`` compares)
    previous_files: dict[str, str] = field(default_factory=dict)  # the manifest after step position - 1


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
        "result": None if "error" in payload else result_of(payload), "error": payload.get("error"),
        "attempt": payload.get("attempt"), "actor": row["actor"], "recorded_at": row["created_at"],
        "started_at": payload.get("started_at"), "duration_ms": payload.get("duration_ms"),
        "idempotency_key": payload.get("idempotency_key"), "payload": payload,
    }


def _checkpoints(run_id, position: int, cache: dict) -> tuple[Any, dict]:
    """(state, manifest) at ``position``: the latest taken checkpoint at or before it (following
    fork lineage). ``cache`` lets N and N-1 share the decoding when the same checkpoint serves both."""
    if position <= 0:
        return None, {}
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
        _require_run(run_id)  # RunNotFoundError for an unknown run; the run is only read when it has no steps
    if not isinstance(position, int) or isinstance(position, bool) or not 1 <= position <= max(total, 0):
        raise BadArgumentsError(
            f"step {position!r} is out of range: run {run_id} has {total} step(s) (positions 1..{total})"
            if total else f"run {run_id} has no recorded steps yet")
    record = _record_at(run_id, position) or {"position": position, "kind": "missing", "step_name": "",
                                               "result": None, "error": None, "payload": {}}
    cache: dict = {}
    state, files = _checkpoints(run_id, position, cache)
    prev_state, prev_files = _checkpoints(run_id, position - 1, cache)
    # The step's own outcome is what it added; state is compared with state, files with files (both decoded).
    outcome = {"error": record["error"]} if record.get("error") else record.get("result")
    diff = {"result": outcome, "results": {"added": {position: outcome}},
            "state": _dict_diff(prev_state, state), "files": _files_diff(prev_files, files)}
    return StepState(position=position, total=total, record=record, results=LazyResults(run_id, position),
                     state=state, files=files, diff=diff, span=_span_at(run_id, position, record),
                     previous_state=prev_state, previous_files=prev_files)


