"""Creating runs: a workflow's harness row, and a new pending run with its first session event.

Below the primitives so that a parent's child start (``ctx.child``) and an operator's
``journal.start`` create runs the same way; ``journal.operations.runs`` is the public door.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.db.models import Subquery

from journal.engine import registry
from journal.models import AgentPause, EventKind, Harness, Run, SessionEvent
from journal.store import doorbell, frozen
from journal.store.errors import BadArgumentsError
from journal.store.serialization import check_text, to_json


def _workflow_name(workflow: str | Callable[..., Any]) -> str:
    if isinstance(workflow, str):
        return workflow
    defn = getattr(workflow, "__durable_workflow__", None)
    if defn is None:
        raise BadArgumentsError(f"{workflow!r} is not a @journal.workflow")
    return defn.name


def _pause(agent: str, column: str) -> Subquery:
    return Subquery(AgentPause.objects.filter(agent=agent).order_by("pk").values(column)[:1])


# What a start reads, in one compiled SELECT: the version's harness row and whether an operator
# paused the agent (AgentPause), its pause as two scalar subqueries beside the harness's id.
_START = frozen.FrozenQuery(
    Harness, ("id", "paused_by", "pause_reason"), lambda _v, name, version, fingerprint, agent: Harness.objects
    .filter(name=name, version=version, fingerprint=fingerprint).order_by()
    .annotate(paused_by=_pause(agent, "paused_by"), pause_reason=_pause(agent, "reason"))
    .values("id", "paused_by", "pause_reason")[:1],
    name="\u27e6name\u27e7", version="\u27e6version\u27e7", fingerprint="\u27e6fingerprint\u27e7",
    agent="\u27e6agent\u27e7")


def _harness_and_pause(defn: registry.WorkflowDef) -> tuple[int, dict | None]:
    """(the harness row's id, the agent's pause or None): one SELECT once the harness row exists."""
    found = _START.rows(name=defn.name, version=defn.version, fingerprint=defn.fingerprint, agent=defn.name)
    if found:
        row = found[0]
        return row["id"], ({"paused_by": row["paused_by"], "reason": row["pause_reason"]}
                           if row["paused_by"] is not None else None)
    pause = AgentPause.objects.filter(agent=defn.name).order_by("pk").values("paused_by", "reason").first()
    return harness_for(defn).id, pause


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


def start_run(workflow: str | Callable[..., Any], args: tuple | list = (), kwargs: dict | None = None, *,
              actor: str = "", parent_id=None, durability: str | None = None,
              checkpoint: str | None = None, run_id=None, concurrency_key: str = "",
              concurrency_limit: int | None = None, subject: str | None = None) -> str:
    """Create a pending run; a worker drives it. Validates everything first: nothing half-written.

    ``subject`` links the run to the person whose data it holds (``journal.erase(subject=)``); a
    child run inherits its parent's.
    """
    kwargs = kwargs or {}
    if subject is not None and (not isinstance(subject, str) or len(subject) > 200):
        raise BadArgumentsError("a subject is a string of at most 200 characters")
    if subject:
        check_text(subject, what="the subject")
    elif parent_id is not None:
        subject = Run.objects.filter(id=parent_id).values_list("subject", flat=True).first() or ""
    defn = registry.get_workflow(_workflow_name(workflow))
    try:
        defn.signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise BadArgumentsError(f"bad arguments for agent {defn.name!r}: {exc}") from None
    run_input = to_json({"args": list(args), "kwargs": kwargs}, what=f"the input of agent {defn.name}")
    if durability is not None and durability not in registry.DURABILITY_MODES:
        raise BadArgumentsError(f"durability must be one of {registry.DURABILITY_MODES}")
    if checkpoint is not None and checkpoint not in registry.CHECKPOINT_POLICIES:
        raise BadArgumentsError(f"checkpoint must be one of {registry.CHECKPOINT_POLICIES}")
    harness_id, pause = _harness_and_pause(defn)
    run_id = run_id or uuid.uuid4()  # a parent records its child's id before creating it
    run = frozen.Row(
        Run,
        **({"paused": True, "paused_by": pause["paused_by"], "pause_reason": f"agent paused: {pause['reason']}"}
           if pause else {}),
        id=run_id, agent=defn.name, harness_id=harness_id, version=defn.version, fingerprint=defn.fingerprint,
        input=run_input, durability=durability or defn.durability,
        checkpoint_policy=checkpoint or defn.checkpoint, created_by=actor, parent_id=parent_id,
        concurrency_key=concurrency_key, concurrency_limit=concurrency_limit, subject=subject or "",
    )
    started = frozen.Row(SessionEvent, run_id=run_id, seq=1, kind=EventKind.RUN_STARTED, actor=actor,
                         payload={"input": run_input, "version": defn.version, "fingerprint": defn.fingerprint})
    bell = (doorbell.CHANNEL, str(run_id)) if doorbell.database_bell() else None
    frozen.insert_all([run, started], bell=bell)  # the run, its first event, the NOTIFY: all or none, one statement
    doorbell.notify(run_id, sent=bell is not None)  # in this process once the rows are committed
    return str(run_id)
