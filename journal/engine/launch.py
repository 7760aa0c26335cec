"""Creating runs: a workflow's harness row, and a new pending run with its first session event.

Below the primitives so that a parent's child start (``ctx.child``) and an operator's
``journal.start`` create runs the same way; ``journal.operations.runs`` is the public door.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from django.db import transaction

from journal.engine import registry
from journal.models import AgentPause, EventKind, Harness, Run, SessionEvent
from journal.store import frozen
from journal.store.doorbell import notify
from journal.store.errors import BadArgumentsError
from journal.store.serialization import check_text, to_json


def _workflow_name(workflow: str | Callable[..., Any]) -> str:
    if isinstance(workflow, str):
        return workflow
    defn = getattr(workflow, "__durable_workflow__", None)
    if defn is None:
        raise BadArgumentsError(f"{workflow!r} is not a @journal.workflow")
    return defn.name


_HARNESS = frozen.FrozenQuery(
    Harness, ("id",), lambda _v, name, version, fingerprint: Harness.objects.filter(
        name=name, version=version, fingerprint=fingerprint).order_by().values("id")[:1],
    name="\u27e6name\u27e7", version="\u27e6version\u27e7", fingerprint="\u27e6fingerprint\u27e7")
_FROZEN = frozen.FrozenQuery(
    AgentPause, ("paused_by", "reason"), lambda _v, agent: AgentPause.objects.filter(agent=agent).order_by("pk")
    .values("paused_by", "reason")[:1], agent="\u27e6agent\u27e7")


def harness_id_for(defn: registry.WorkflowDef) -> int:
    """The id of the workflow version's harness row: one compiled SELECT once it exists."""
    found = _HARNESS.rows(name=defn.name, version=defn.version, fingerprint=defn.fingerprint)
    return found[0]["id"] if found else harness_for(defn).id


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
        inspect.signature(defn.fn).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise BadArgumentsError(f"bad arguments for agent {defn.name!r}: {exc}") from None
    run_input = to_json({"args": list(args), "kwargs": kwargs}, what=f"the input of agent {defn.name}")
    if durability is not None and durability not in registry.DURABILITY_MODES:
        raise BadArgumentsError(f"durability must be one of {registry.DURABILITY_MODES}")
    if checkpoint is not None and checkpoint not in registry.CHECKPOINT_POLICIES:
        raise BadArgumentsError(f"checkpoint must be one of {registry.CHECKPOINT_POLICIES}")
    harness_id = harness_id_for(defn)
    freeze = _FROZEN.rows(agent=defn.name)
    run = Run(
        **({"paused": True, "paused_by": freeze[0]["paused_by"],
            "pause_reason": f"agent paused: {freeze[0]['reason']}"} if freeze else {}),
        **({"id": run_id} if run_id else {}),  # a parent records its child's id before creating it
        agent=defn.name, harness_id=harness_id, version=defn.version, fingerprint=defn.fingerprint,
        input=run_input, durability=durability or defn.durability,
        checkpoint_policy=checkpoint or defn.checkpoint, created_by=actor, parent_id=parent_id,
        concurrency_key=concurrency_key, concurrency_limit=concurrency_limit, subject=subject or "",
    )
    started = SessionEvent(run_id=run.id, seq=1, kind=EventKind.RUN_STARTED, actor=actor,
                           payload={"input": run_input, "version": defn.version, "fingerprint": defn.fingerprint})
    with transaction.atomic():  # two compiled INSERTs: the run and its first event, or neither
        frozen.insert(run)
        frozen.insert(started)
        notify(run.id)
    return str(run.id)
