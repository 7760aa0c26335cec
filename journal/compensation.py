"""Compensation (saga): undo completed effects in reverse order. Filled in by the time-travel work."""

from __future__ import annotations


def after_failure(ctx) -> None:
    """Hook after a run failed."""


def after_cancel(ctx) -> None:
    """Hook after a run was cancelled."""


def compensate_run(ctx) -> None:
    raise NotImplementedError("compensation is not built yet")


def after_cancel_idle(run_id, actor: str = "") -> None:
    """Hook after a run no worker held was cancelled."""
