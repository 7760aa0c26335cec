"""A plain registry filled by the decorators at import time. No engine singleton: tests reset it."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from journal.store.errors import UnknownAgentError, WorkflowDefinitionError

DURABILITY_MODES = ("sync", "async", "exit")
CHECKPOINT_POLICIES = ("every", "selective", "manual")
IN_DOUBT_POLICIES = ("needs_attention", "retry", "reconcile")


@dataclass(frozen=True)
class StepDef:
    name: str
    fn: Callable[..., Any]
    retries: int = 0
    retry_delay: float = 0.5
    effect: bool = False
    compensate: Callable[..., Any] | None = None
    checkpoint: bool | None = None  # True: always checkpoint after it; False: never; None: the policy decides
    durability: str | None = None  # overrides the workflow's mode for this step's record
    on_in_doubt: str = "needs_attention"
    reconcile: Callable[..., Any] | None = None
    accepts_fencing_token: bool = False
    accepts_idempotency_key: bool = False
    atomic: bool = False  # its database writes and its journal record commit in one transaction


@dataclass(frozen=True)
class WorkflowDef:
    name: str
    fn: Callable[..., Any]
    version: str = "1"
    durability: str = "sync"
    checkpoint: str = "selective"
    description: str = ""
    fingerprint: str = ""
    module: str = ""
    max_concurrency: int | None = None  # per-agent limit on running runs
    options: dict = field(default_factory=dict)

    @cached_property
    def signature(self) -> inspect.Signature:
        """The function's signature, computed once: every start checks its arguments against it."""
        return inspect.signature(self.fn)


_workflows: dict[str, WorkflowDef] = {}
_steps: dict[str, StepDef] = {}


def code_fingerprint(fn: Callable[..., Any]) -> str:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = fn.__qualname__
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def register_workflow(defn: WorkflowDef) -> None:
    existing = _workflows.get(defn.name)
    if existing is not None and existing.fn.__qualname__ != defn.fn.__qualname__ or (
        existing is not None and existing.module != defn.module
    ):
        raise WorkflowDefinitionError(
            f"two workflows are named {defn.name!r} ({existing.module}.{existing.fn.__qualname__} and "
            f"{defn.module}.{defn.fn.__qualname__}); give one another name="
        )
    _workflows[defn.name] = defn


def register_step(defn: StepDef) -> None:
    _steps[defn.name] = defn


def get_workflow(name: str) -> WorkflowDef:
    try:
        return _workflows[name]
    except KeyError:
        raise UnknownAgentError(name, list(_workflows)) from None


def workflows() -> dict[str, WorkflowDef]:
    return dict(_workflows)


def steps() -> dict[str, StepDef]:
    return dict(_steps)


def reset() -> None:
    """Forget every registration (tests that define throwaway workflows call this)."""
    _workflows.clear()
    _steps.clear()


def snapshot() -> tuple[dict, dict]:
    return dict(_workflows), dict(_steps)


def restore(snap: tuple[dict, dict]) -> None:
    _workflows.clear()
    _workflows.update(snap[0])
    _steps.clear()
    _steps.update(snap[1])
