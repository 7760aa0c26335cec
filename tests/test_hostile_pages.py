"""A lone surrogate (or other text no encoder can write) in a run's data never 500s a page.

Python strings may hold lone surrogates ("\\ud800"), UTF-8 cannot. JSON columns keep them escaped
on SQLite, so a run can come back from the database carrying them in its input, output, step
payloads, signals, approvals, checkpoints, spans and sandbox records; PostgreSQL refuses them at
the door (jsonb and text cannot hold them), so the stored-data walk runs on SQLite only. The
render-level tests run on both: the response layer makes any text writable, wherever it came from.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from journal.models import (
    Approval,
    Checkpoint,
    EventKind,
    Run,
    RunStatus,
    Sandbox,
    SandboxCommand,
    SessionEvent,
    SideEffect,
    Signal,
    TraceSpan,
)

LONE = "\ud800"
EVIL = f"before{LONE}after \udfff \ud83d"  # high, low, and a high without its low half

needs_sqlite = pytest.mark.skipif("connection.vendor != 'sqlite'",
                                  reason="PostgreSQL cannot store a lone surrogate (jsonb/text refuse it)")


def _hostile(status: str) -> Run:
    """One run with EVIL in every JSON column the dashboard renders, straight through the ORM."""
    now = timezone.now()
    run = Run.objects.create(
        agent="hostile", version="1", status=status, input={"args": [EVIL], "kwargs": {EVIL: EVIL}},
        output={"answer": EVIL, "list": [EVIL, {EVIL: [EVIL]}]}, steps=3,
        progress={"done": 1, "total": 3, "label": EVIL}, started_at=now - timedelta(seconds=5),
        waiting_for={"kind": "signal", "name": EVIL} if status == RunStatus.SUSPENDED else None,
        finished_at=now if status in (RunStatus.COMPLETED, RunStatus.FAILED) else None)
    seq = 0

    def event(kind, position=None, **payload):
        nonlocal seq
        seq += 1
        SessionEvent.objects.create(run=run, seq=seq, kind=kind, position=position, step_name=f"step{position}",
                                    payload=payload)

    event(EventKind.RUN_STARTED, args=[EVIL])
    for pos in (1, 2, 3):
        event(EventKind.STEP_COMPLETED, pos, result={"text": EVIL * pos, "n": pos})
        TraceSpan.objects.create(run=run, span_id=f"s{pos}", name=f"step{pos}", position=pos, started_at=now,
                                 ended_at=now, duration_ms=1.5, attributes={"note": EVIL})
        Checkpoint.objects.create(run=run, position=pos, step_name=f"step{pos}", state={"memo": EVIL * pos})
    event(EventKind.STEP_FAILED, 3, error=EVIL, traceback=EVIL)
    event(EventKind.SIGNAL_RECEIVED, 3, name="go", payload={"why": EVIL})
    event(EventKind.SANDBOX_COMMAND, 3, stdout=EVIL)
    Signal.objects.create(run=run, name="go", payload={"why": EVIL, "list": [EVIL]})
    SideEffect.objects.create(run=run, position=2, step_name="pay", idempotency_key=f"{run.id}:2", epoch=1,
                              status="started", args={"to": EVIL}, result={"id": EVIL})
    box = Sandbox.objects.create(run=run, root="/tmp/box")
    SandboxCommand.objects.create(run=run, sandbox=box, position=3, command="echo", argv=["echo", EVIL],
                                  exit_code=0, files_created=[EVIL], files_modified=[EVIL])
    if status == RunStatus.SUSPENDED:
        Approval.objects.create(run=run, position=4, prompt="approve?", context={"doc": EVIL})
    return run


def _pages(run: Run) -> dict[str, str]:
    rid = str(run.id)
    return {
        "detail": reverse("run_detail", args=[rid]),
        "detail journal fragment": reverse("run_detail", args=[rid]) + "?step=2&fragment=journal",
        "header": reverse("run_header", args=[rid]),
        "tail": reverse("run_tail", args=[rid]) + "?after=0",
        "events page": reverse("run_events", args=[rid]) + "?after=0&until=99",
        **{f"step {n}": reverse("run_detail", args=[rid]) + f"?step={n}" for n in (1, 2, 3, 99, -1)},
        **{f"payload {seq}": reverse("event_payload", args=[rid, seq]) for seq in (1, 2, 5, 6, 7)},
    }


LISTS = {
    "runs list": "/",
    "runs list searched": "/?q=after",
    "runs live": None,  # filled with the live ids
    "approvals": "/approvals/",
    "approvals list fragment": "/approvals/?fragment=list",
    "workers": "/workers/",
    "overview": "/overview/",
    "audit": "/audit/",
}


@needs_sqlite
@pytest.mark.django_db
def test_every_page_of_a_run_full_of_lone_surrogates_answers_200(client, personas):
    runs = [_hostile(status) for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.SUSPENDED,
                                            RunStatus.RUNNING)]
    assert Run.objects.get(id=runs[0].id).output["answer"] == EVIL  # stored and read back as-is
    client.force_login(personas["admin"])
    pages = {}
    for run in runs:
        pages.update({f"{run.status} {name}": url for name, url in _pages(run).items()})
    lists = dict(LISTS, **{"runs live": "/runs/live/?ids=" + ",".join(str(r.id) for r in runs)})
    pages.update(lists)
    failures = {}
    for name, url in pages.items():
        htmx = {"HTTP_HX_REQUEST": "true"} if "fragment" in url else {}
        response = client.get(url, **htmx)
        if response.status_code not in (200, 286):
            failures[name] = response.status_code
        elif response.get("Content-Type", "").startswith("text/html"):
            response.content.decode("utf-8")  # strictly valid UTF-8
    assert not failures, failures
    assert len(pages) >= 4 * 12 + 8
    shown = client.get(_pages(runs[0])["step 2"]).content.decode()
    assert "before\\ud800after" in shown, "the data is shown, escaped, not hidden"


@pytest.mark.django_db
def test_a_page_rendered_with_unencodable_text_is_valid_utf8_and_shows_where_it_was(client, personas):
    """Text that never touched a database (an exception message, a template value): the same answer on
    both databases, and the escaped form says what was there instead of hiding it."""
    html = render_to_string("runs/detail.html#header", {"run": Run(agent=EVIL, status="failed", error=EVIL)})
    html.encode("utf-8")
    assert "before\\ud800after" in html and "\\udfff" in html


@pytest.mark.django_db
def test_api_reads_a_run_whose_output_holds_a_lone_surrogate(client):
    """The API's JSON encoder escapes what UTF-8 cannot hold (only SQLite can store such an output)."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL cannot store a lone surrogate")
    from runs.models import ApiToken

    run = _hostile(RunStatus.COMPLETED)
    _token, secret = ApiToken.issue("reader", ["runs:read"])
    response = client.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200, response.content[:500]
    assert response.json()["output"]["answer"] == EVIL
