"""Compensation on request: an operator undoes a finished run's effects (the saga is ``journal.driver.saga``)."""

from __future__ import annotations

from journal.driver.saga import begin, resolve_compensation
from journal.models import Run
from journal.operations.runs import get_run, refuse_if_erased
from journal.store import runstate
from journal.store.errors import RunStateError

__all__ = ["compensate", "resolve_compensation"]


def compensate(run_id, *, actor: str = "", reason: str = "") -> Run:
    """Undo the completed effects of a failed, cancelled or needs_attention run (newest first).

    Returns the run, now ``compensating``; a worker does the undoing. Refused (RunStateError,
    nothing changed) for any other state or when there is nothing to undo.
    """
    run = get_run(run_id)
    refuse_if_erased(run, "compensate")
    if run.status not in runstate.COMPENSABLE:
        raise RunStateError(f"cannot compensate run {run.id}: it is {run.status}; only a failed, cancelled or "
                            "needs_attention run can be compensated")
    begin(run.id, tuple(runstate.COMPENSABLE), cause=runstate.Cause.OPERATOR, actor=actor,
          reason=reason or "compensation requested", action="compensate")
    return get_run(run.id)
