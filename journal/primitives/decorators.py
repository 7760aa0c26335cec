"""@journal.workflow and @journal.step: plain functions made durable.

They fail at decoration time for anything the engine could not honour (nested functions,
unknown modes, an effect that cannot receive its idempotency key) rather than at 3 a.m.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from journal.engine import registry
from journal.primitives.context import current_or_none
from journal.primitives.steps import invoke_step
from journal.store.errors import WorkflowDefinitionError
from journal.store.outage import engine_call

# A step called in a workflow: its engine's outages become DatabaseUnavailable (wrapped once, not per call).
_invoke_step = engine_call(invoke_step)

JOURNAL_DB_ALIAS = DEFAULT_DB_ALIAS  # the engine writes its tables through Django's default database


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _check_top_level(fn: Callable[..., Any], what: str) -> None:
    if "<locals>" in fn.__qualname__:
        raise WorkflowDefinitionError(
            f"{what} {fn.__qualname__} is defined inside a function; a resumed run must find it again by name, "
            "so define it at module level"
        )


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _check_atomic(func: Callable[..., Any], *, effect: bool, durability: str | None, using: str | None) -> None:
    """An atomic step holds only where its writes and the journal share one transaction."""
    what = f"atomic step {func.__qualname__}"
    if effect:
        raise WorkflowDefinitionError(f"{what}: effect=True and atomic=True exclude each other (an effect reaches "
                                      "outside the database, where no transaction of ours can hold it)")
    if durability not in (None, "sync"):
        raise WorkflowDefinitionError(f"{what}: its record commits with its writes, so durability={durability!r} "
                                      "cannot apply")
    alias = using or DEFAULT_DB_ALIAS
    if alias not in connections.settings:
        raise WorkflowDefinitionError(f"{what}: no database named {alias!r} (DATABASES)")
    if alias != JOURNAL_DB_ALIAS:
        raise WorkflowDefinitionError(f"{what}: it writes to database {alias!r}, but the journal is in "
                                      f"{JOURNAL_DB_ALIAS!r}: one transaction cannot span two databases")


def step(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retries: int = 0,
    retry_delay: float = 0.5,
    effect: bool = False,
    compensate: Callable[..., Any] | None = None,
    checkpoint: bool | None = None,
    durability: str | None = None,
    on_in_doubt: str | None = None,
    reconcile: Callable[..., Any] | None = None,
    atomic: bool = False,
    using: str | None = None,
):
    """Make a function a durable step: inside a workflow its result is journaled and replayed.

    ``effect=True`` makes it exactly-once: it receives ``idempotency_key=`` (and ``fencing_token=``
    if it accepts one), and an interrupted effect is never silently re-run (see ``on_in_doubt``).

    ``atomic=True`` is for a step whose work is a write to this application's own database (the
    journal's, ``using`` names it when it is not "default"): the step's writes and its journal
    record commit in one transaction, fenced by the run's epoch, so it is exactly-once outright —
    a crash before the commit leaves neither (the step runs again), after it both (it replays).
    Use an effect instead for anything outside that database (an API, a payment, an email).

    Called outside a workflow, a step is a plain function call.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        _check_top_level(func, "step")
        if retries < 0:
            raise WorkflowDefinitionError(f"step {func.__qualname__}: retries must be >= 0")
        if durability is not None and durability not in registry.DURABILITY_MODES:
            raise WorkflowDefinitionError(
                f"step {func.__qualname__}: durability must be one of {registry.DURABILITY_MODES}"
            )
        policy = on_in_doubt or ("reconcile" if reconcile else "needs_attention")
        if policy not in registry.IN_DOUBT_POLICIES:
            raise WorkflowDefinitionError(
                f"step {func.__qualname__}: on_in_doubt must be one of {registry.IN_DOUBT_POLICIES}"
            )
        if policy == "reconcile" and reconcile is None:
            raise WorkflowDefinitionError(f"step {func.__qualname__}: on_in_doubt='reconcile' needs reconcile=")
        if (compensate or reconcile or on_in_doubt) and not effect:
            raise WorkflowDefinitionError(
                f"step {func.__qualname__}: compensate=, reconcile= and on_in_doubt= apply to effects only "
                "(add effect=True)"
            )
        if atomic:
            _check_atomic(func, effect=effect, durability=durability, using=using)
        elif using is not None:
            raise WorkflowDefinitionError(f"step {func.__qualname__}: using= applies to atomic steps only")
        takes_key = _accepts(func, "idempotency_key")
        if effect and not takes_key:
            raise WorkflowDefinitionError(
                f"effect {func.__qualname__} must accept an idempotency_key keyword: the outside system needs it "
                "to refuse a duplicate"
            )
        defn = registry.StepDef(
            name=name or _qualified(func),
            fn=func,
            retries=retries,
            retry_delay=retry_delay,
            effect=effect,
            compensate=compensate,
            checkpoint=checkpoint,
            durability=durability,
            on_in_doubt=policy,
            reconcile=reconcile,
            accepts_fencing_token=_accepts(func, "fencing_token"),
            accepts_idempotency_key=takes_key,
            atomic=atomic,
        )
        registry.register_step(defn)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = current_or_none()
            if ctx is None or ctx.in_step:
                return func(*args, **kwargs)  # a plain call (inside another step's body: that body's code)
            return _invoke_step(ctx, defn, args, kwargs)

        wrapper.__durable_step__ = defn  # type: ignore[attr-defined]
        return wrapper

    return decorate(fn) if fn is not None else decorate


def workflow(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    durability: str = "sync",
    checkpoint: str = "selective",
    description: str = "",
    max_concurrency: int | None = None,
    signals: tuple[str, ...] | list[str] = (),
    compensate_on_cancel: bool = False,
):
    """Register a workflow (an agent). Its first parameter receives the journal.Context."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        _check_top_level(func, "workflow")
        if durability not in registry.DURABILITY_MODES:
            raise WorkflowDefinitionError(
                f"workflow {func.__qualname__}: durability must be one of {registry.DURABILITY_MODES}"
            )
        if checkpoint not in registry.CHECKPOINT_POLICIES:
            raise WorkflowDefinitionError(
                f"workflow {func.__qualname__}: checkpoint must be one of {registry.CHECKPOINT_POLICIES}"
            )
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise WorkflowDefinitionError(
                f"workflow {func.__qualname__} must take the journal.Context as its first positional parameter"
            )
        if max_concurrency is not None and max_concurrency < 1:
            raise WorkflowDefinitionError(f"workflow {func.__qualname__}: max_concurrency must be >= 1")
        defn = registry.WorkflowDef(
            name=name or func.__name__,
            fn=func,
            version=str(version),
            durability=durability,
            checkpoint=checkpoint,
            description=description or (inspect.getdoc(func) or "").split("\n\n")[0],
            fingerprint=registry.code_fingerprint(func),
            module=func.__module__,
            max_concurrency=max_concurrency,
            options={**({"signals": tuple(signals)} if signals else {}),
                     **({"compensate_on_cancel": True} if compensate_on_cancel else {})},
        )
        registry.register_workflow(defn)
        func.__durable_workflow__ = defn  # type: ignore[attr-defined]
        return func

    return decorate(fn) if fn is not None else decorate
