"""A long journal for the run page's tests, seeded in a few bulk inserts (driving 10k real steps takes minutes).

The rows have the shape the engine writes: dense seqs, one ``step_completed`` per position, a
span per step (and a model-call span every tenth step), a checkpoint decision every fifth step.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

import tests.agents.dashboard_demo  # noqa: F401  (registers dash_many, the workflow these rows claim to be)
from journal.models import Checkpoint, EventKind, Run, RunStatus, SessionEvent, TraceSpan

STEP_MS = 100  # each step starts 100 ms after the one before


def seed_long_run(steps: int, *, status: str = RunStatus.COMPLETED) -> str:
    """A finished ``dash_many`` run of ``steps`` steps: returns its id."""
    start = timezone.now() - timedelta(milliseconds=STEP_MS * steps + 1000)
    run = Run.objects.create(agent="dash_many", version="1", status=status, input={"args": [steps], "kwargs": {}},
                             output=steps if status == RunStatus.COMPLETED else None, steps=steps,
                             created_at=start, started_at=start,
                             finished_at=start + timedelta(milliseconds=STEP_MS * (steps + 1)))
    events = [SessionEvent(run=run, seq=1, kind=EventKind.RUN_STARTED, payload={}, created_at=start)]
    spans, checkpoints = [], []
    for p in range(1, steps + 1):
        at = start + timedelta(milliseconds=STEP_MS * p)
        events.append(SessionEvent(run=run, seq=len(events) + 1, kind=EventKind.STEP_COMPLETED, position=p,
                                   step_name="fetch_doc", payload={"result": {"words": p}}, created_at=at))
        spans.append(TraceSpan(run=run, span_id=f"s{p}", name="fetch_doc", kind="step", position=p,
                               status="error" if p % 97 == 0 else "ok", started_at=at,
                               ended_at=at + timedelta(milliseconds=60), duration_ms=60))
        if p % 10 == 0:
            spans.append(TraceSpan(run=run, span_id=f"m{p}", parent_span_id=f"s{p}", name="model:scripted-small",
                                   kind="model", position=p, started_at=at + timedelta(milliseconds=10),
                                   ended_at=at + timedelta(milliseconds=50), duration_ms=40, tokens_in=10,
                                   tokens_out=5))
        if p % 5 == 0:
            checkpoints.append(Checkpoint(run=run, position=p, step_name="fetch_doc", decision="skipped",
                                          reason="no recovery-relevant change", created_at=at))
    end = start + timedelta(milliseconds=STEP_MS * (steps + 1))
    events.append(SessionEvent(run=run, seq=len(events) + 1, kind=EventKind.RUN_COMPLETED, payload={},
                               created_at=end))
    SessionEvent.objects.bulk_create(events, batch_size=2000)
    TraceSpan.objects.bulk_create(spans, batch_size=2000)
    Checkpoint.objects.bulk_create(checkpoints, batch_size=2000)
    return str(run.id)
