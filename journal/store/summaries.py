"""The search summaries' writes (``journal.models.search``): which step names a run recorded, and
the step it failed at. Called inside a transaction the caller already holds (the writer's commit,
the settle of a failure, a fork's copy), never as a commit of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from journal.models import RunStep, step_name_keys


def record_step_names(run_id: uuid.UUID | str, names: Iterable[str], *, failed: bool = False) -> None:
    """Note that the run recorded these step names (each with its dotted tails); repeats are ignored
    by the unique index (``ON CONFLICT DO NOTHING`` / ``INSERT OR IGNORE``), so a resumed run may say
    them again at no cost but a statement."""
    keys = step_keys(names)
    if keys:
        RunStep.objects.bulk_create([RunStep(run_id=run_id, name=key, failed=failed) for key in keys],
                                    ignore_conflicts=True)


def step_keys(names: Iterable[str]) -> list[str]:
    """The summary rows' names for these step names: each with its dotted tails, sorted, once."""
    return sorted({key for name in names if name for key in step_name_keys(name)})


def record_failed_step(run_id: uuid.UUID | str, name: str) -> None:
    """The step the run failed at, replacing the one of an earlier failure (a retried run that failed again)."""
    RunStep.objects.filter(run_id=run_id, failed=True).delete()
    if name:
        record_step_names(run_id, [name], failed=True)
