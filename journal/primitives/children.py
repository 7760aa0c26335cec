"""Child runs: ``ctx.child`` and ``ctx.map_children`` start runs with their own journals and wait durably.

A child occupies one step position in its parent. Starting it writes a ``child_started``
marker (the child's run id, decided before the write) and creates the child run in the same
transaction, so a replay finds the marker and never starts a second child for that position.
The parent then suspends (``waiting_for={"kind": "child", ...}``) holding no thread; the end of
its last live child wakes it inside that child's final transaction (``wake_parent``, called by
the executor). The outcome is recorded at the child's position, so a failed child raises the
same ``ChildRunError`` on every replay.

``map_children`` gives each item its own position up front, so positions after it never shift,
and starts every child at once, in one transaction, as one *group* (``Run.concurrency_key``)
whose limit the claim enforces: at most ``concurrency`` of them run at a time. The parent
sleeps until the whole group has ended and then replays once, so a fan-out of n children
costs O(n), not one replay of the parent per finished child. Results come in item order. The
per-agent limit (``@workflow(max_concurrency=)``) still applies to children, in ``leases.claim``.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from journal.engine import registry
from journal.engine.launch import start_run
from journal.engine.protocol import begin, recorded_result, result_payload
from journal.models import TERMINAL_STATUSES, EventKind, Run, RunStatus
from journal.store import runstate
from journal.store.doorbell import notify
from journal.store.errors import BadArgumentsError, DurableError, StepError, Suspend
from journal.store.serialization import fingerprint, to_json

MAX_IDS_SHOWN = 50  # child ids kept in the parent's waiting_for, for people; the group is what wakes it


class ChildRunError(StepError):
    """A child run failed, was cancelled or compensated: raised in the parent at the child's position."""

    def __init__(self, step_name: str, child_run_id: str, child_status: str, message: str):
        self.child_run_id = child_run_id
        self.child_status = child_status
        super().__init__(step_name, "ChildRunError", message)


class _Slot:
    """One child's position in the parent and what the journal knows about it."""

    __slots__ = ("position", "args", "kwargs", "args_hash", "record", "child_id")

    def __init__(self, position: int, args: tuple, kwargs: dict, args_hash: str):
        self.position = position
        self.args = args
        self.kwargs = kwargs
        self.args_hash = args_hash
        self.record: dict | None = None
        self.child_id: str | None = None


def _definition(workflow: str | Callable[..., Any]) -> registry.WorkflowDef:
    if isinstance(workflow, str):
        return registry.get_workflow(workflow)
    defn = getattr(workflow, "__durable_workflow__", None)
    if defn is None:
        raise BadArgumentsError(f"{workflow!r} is not a @journal.workflow")
    return defn


def _outcome(record: dict) -> Any:
    payload = record["payload"]
    if "error" in payload:
        raise ChildRunError(record["step_name"], payload.get("child_run_id", ""), payload.get("child_status", ""),
                            payload["error"].get("message", ""))
    return recorded_result(record)


def _slot(ctx, defn: registry.WorkflowDef, step_name: str, args: tuple, kwargs: dict) -> _Slot:
    call = to_json({"args": list(args), "kwargs": kwargs}, what=f"the arguments of child {defn.name}")
    args_hash = fingerprint(call)
    position, record = begin(ctx, step_name, args_hash)
    slot = _Slot(position, args, kwargs, args_hash)
    slot.record = record
    if slot.record is None:
        marker = ctx.markers.get(position, {}).get(EventKind.CHILD_STARTED)
        if marker is not None:
            slot.child_id = marker["child_run_id"]
    return slot


def _validate(defn: registry.WorkflowDef, slot: _Slot) -> None:
    try:
        inspect.signature(defn.fn).bind(None, *slot.args, **slot.kwargs)
    except TypeError as exc:
        raise BadArgumentsError(f"bad arguments for child agent {defn.name!r}: {exc}") from None


def _start(ctx, defn: registry.WorkflowDef, step_name: str, slots: list[_Slot], group: str, limit: int) -> None:
    """Record the slots' markers and create their children in one transaction: a replay can never
    start one twice, and a crash in between leaves neither."""
    markers = []
    for slot in slots:
        slot.child_id = str(uuid.uuid4())
        marker = {"child_run_id": slot.child_id, "agent": defn.name, "args_hash": slot.args_hash}
        ctx.writer.record(EventKind.CHILD_STARTED, marker, position=slot.position, step_name=step_name,
                          actor=ctx.worker_id, durability="exit")
        markers.append((slot, marker))

    def create() -> None:
        for slot in slots:
            start_run(defn.name, slot.args, slot.kwargs, actor=f"run:{ctx.run_id}", parent_id=ctx.run.id,
                      run_id=slot.child_id, concurrency_key=group, concurrency_limit=limit)

    ctx.writer.barrier(extra=create)
    for slot, marker in markers:
        ctx.markers.setdefault(slot.position, {})[EventKind.CHILD_STARTED] = marker


def _finish(ctx, step_name: str, slot: _Slot, child: dict) -> None:
    """Record a finished child's outcome at its position (replay then never looks at the child again)."""
    base = {"kind": "child", "child_run_id": slot.child_id, "child_status": child["status"],
            "args_hash": slot.args_hash}
    if child["status"] == RunStatus.COMPLETED:
        payload = {**result_payload(child["output"]), **base}
    else:
        why = child["error"] or child["status"]
        payload = {**base, "error": {"type": "ChildRunError",
                                     "message": f"child run {slot.child_id} ({child['agent']}) {child['status']}: "
                                                f"{why}"[:4000]}}
    seq = ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=slot.position, step_name=step_name,
                            durability="exit")
    slot.record = {"seq": seq, "kind": EventKind.STEP_COMPLETED, "step_name": step_name, "payload": payload}


def _advance(ctx, defn: registry.WorkflowDef, step_name: str, slots: list[_Slot], concurrency: int) -> list:
    """Record finished children, start new ones up to ``concurrency``; return results or suspend."""
    started = [s for s in slots if s.record is None and s.child_id is not None]
    if started:
        rows = {str(r["id"]): r for r in Run.objects.filter(id__in=[s.child_id for s in started])
                .values("id", "status", "output", "error", "agent")}
        for slot in started:
            row = rows.get(slot.child_id)
            if row is None:  # deleted by retention or by hand: say so rather than wait forever
                row = {"status": "missing", "error": "the child run no longer exists", "agent": defn.name,
                       "output": None}
            if row["status"] in TERMINAL_STATUSES or row["status"] == "missing":
                _finish(ctx, step_name, slot, row)
    live = [s for s in slots if s.record is None and s.child_id is not None]
    waiting = [s for s in slots if s.record is None and s.child_id is None]
    for slot in waiting:
        _validate(defn, slot)  # all of them before any start: bad input starts nothing
    group = group_of(ctx.run_id, slots[0].position)
    if waiting:
        ctx.check_interrupts()
        _start(ctx, defn, step_name, waiting, group, concurrency)
        live += waiting
    if live:
        raise Suspend({"kind": "child", "position": slots[0].position, "agent": defn.name, "group": group,
                       "child_run_ids": [s.child_id for s in live][:MAX_IDS_SHOWN],
                       "done": sum(1 for s in slots if s.record is not None), "total": len(slots)})
    return [_outcome(s.record) for s in slots]  # the first failure, in item order, raises


def run_child(ctx, workflow: str | Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Start one child run (once per position) and return its output; raises ChildRunError if it failed."""
    ctx.check_interrupts()
    defn = _definition(workflow)
    step_name = f"child:{defn.name}"
    slot = _slot(ctx, defn, step_name, tuple(args), dict(kwargs))
    if slot.record is not None:
        return _outcome(slot.record)
    return _advance(ctx, defn, step_name, [slot], 1)[0]


def map_children(ctx, workflow: str | Callable[..., Any], items: list, *, concurrency: int = 8) -> list:
    """One child per item (called as ``workflow(ctx, item)``), at most ``concurrency`` live; results in order."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise DurableError("map_children needs a concurrency of at least 1")
    ctx.check_interrupts()
    defn = _definition(workflow)
    step_name = f"child:{defn.name}"
    slots = [_slot(ctx, defn, step_name, (item,), {}) for item in list(items)]
    if all(s.record is not None for s in slots):
        return [_outcome(s.record) for s in slots]
    return _advance(ctx, defn, step_name, slots, concurrency)


def group_of(run_id, position: int) -> str:
    """The concurrency group of the children started at ``position`` of a run."""
    return f"{run_id}:{position}"


def _group_open(group: str) -> bool:
    """Does a child of the group still run or wait? (an EXISTS on a partial index: O(1) per check)"""
    return Run.objects.filter(concurrency_key=group).exclude(status__in=TERMINAL_STATUSES).exists()


def after_suspend(ctx, waiting_for: dict, final: list) -> None:
    """Inside the suspension's transaction: a group whose children all ended while the parent ran wakes it."""
    group = waiting_for.get("group")
    if group and not _group_open(group) and runstate.wake(ctx.run.id, at_epoch=ctx.epoch):
        final[0] = RunStatus.PENDING


def wake_parent(parent_id, group: str = "") -> bool:
    """A child ended: make its parent runnable if that child was the last of its group to end.

    The parent's row is locked first, so of two children ending at once the second to commit sees
    the first one ended (PostgreSQL, READ COMMITTED) and no wake-up is lost."""
    with transaction.atomic():  # (a savepoint inside the child's final transaction)
        runstate.lock_for_wake(parent_id)
        if group and _group_open(group):
            return False
        woke = runstate.wake(parent_id, waiting_for={"kind": "child"})
        if woke:
            notify(parent_id)
    return bool(woke)


def children_of(run_id) -> list[Run]:
    """Lineage for the dashboard: the runs this run started, oldest first."""
    return list(Run.objects.filter(parent_id=run_id).order_by("created_at", "id"))
