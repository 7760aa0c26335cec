"""The search summaries' writes (``journal.models.search``): which step names a run recorded, and
the step it failed at. Called inside a transaction the caller already holds (the writer's commit,
the settle of a failure, a fork's copy), never as a commit of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db import DEFAULT_DB_ALIAS, connections

from journal.models import RunStep, step_name_keys
from journal.store import prepared

_INSERT: dict[tuple[str, int], str] = {}


def record_step_names(run_id: uuid.UUID | str, names: Iterable[str], *, failed: bool = False) -> None:
    """Note that the run recorded these step names (each with its dotted tails); repeats are ignored
    by the unique index (``ON CONFLICT DO NOTHING``, on both databases), so a resumed run may say
    them again at no cost but a statement.

    The statement is written here and kept per shape rather than built by ``bulk_create``: a run's
    first step carries it, and the ORM's building it was a tenth of a ten-step run's CPU."""
    keys = step_keys(names)
    if not keys:
        return
    conn = connections[DEFAULT_DB_ALIAS]
    pg = conn.vendor == "postgresql"
    sql = _INSERT.get((conn.vendor, len(keys)))
    if sql is None:
        row = "(%s::uuid, %s, %s)" if pg else "(%s, %s, %s)"
        sql = _INSERT[(conn.vendor, len(keys))] = (
            f"INSERT INTO {RunStep._meta.db_table} (run_id, name, failed) VALUES {', '.join([row] * len(keys))} "
            "ON CONFLICT DO NOTHING")
    run = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    run_param = run if pg else run.hex
    prepared.execute(conn, sql, [value for key in keys for value in (run_param, key, failed)])


def step_keys(names: Iterable[str]) -> list[str]:
    """The summary rows' names for these step names: each with its dotted tails, sorted, once."""
    return sorted({key for name in names if name for key in step_name_keys(name)})


def record_failed_step(run_id: uuid.UUID | str, name: str) -> None:
    """The step the run failed at, replacing the one of an earlier failure (a retried run that failed again)."""
    RunStep.objects.filter(run_id=run_id, failed=True).delete()
    if name:
        record_step_names(run_id, [name], failed=True)
