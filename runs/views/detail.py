"""Run detail: header, journal stepper, timeline, tabs, and a live tail of new events."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from journal.models import (
    Checkpoint,
    Run,
    SandboxCommand,
    SessionEvent,
    SideEffect,
    TraceSpan,
)
from journal.operations.approvals import pending_approvals
from journal.operations.runs import refusal
from runs import charts, stepper, window
from runs.permissions import viewer_required
from runs.views.common import get_run_or_404, parse_int
from runs.views.thread import thread_view

EVENTS_PAGE = 100  # events of the window's steps per page; the next page is a click away
TAB_ROWS = 200
TAIL_ROWS = 200
# offered only where the engine allows them (journal.operations.runs.refusal says why not)
LIFECYCLE = ("pause", "unpause", "resume", "retry", "compensate", "cancel", "signal")


def _int(value: str | None, default: int) -> int:
    """A step or seq cursor from the query string; anything that is not one falls back to ``default``."""
    parsed = parse_int(value)
    return default if parsed is None else parsed


@require_GET
@viewer_required
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    run = get_run_or_404(run_id)
    total = stepper.total_steps(run)
    step = stepper.step_view(run, _int(request.GET.get("step"), total or 1), total) if total else None
    # a history restore (Back after an htmx swap) asks for the page a pushed URL names: the whole page
    fragment = request.GET.get("fragment") if request.htmx and not request.htmx.history_restore_request else None
    if fragment == "journal":
        known = parse_int(request.GET.get("known_total"))
        if known is not None and known == total:  # the stepper's poll: nothing new, leave the page alone
            return HttpResponseStopPolling() if run.is_terminal else HttpResponse(status=204)
        return render(request, "runs/detail.html#journal", {"run": run, "step": step, "total_steps": total})
    effects, effect_total = _capped(SideEffect.objects.filter(run=run).order_by("position"))
    commands, command_total = _capped(SandboxCommand.objects.filter(run=run).order_by("created_at", "id"))
    context = {"run": run, "step": step, "total_steps": total, **_window_context(request, run, step, total),
               "effects": effects, "effect_total": effect_total, "commands": commands, "command_total": command_total}
    if fragment == "window":  # the window moved: the timeline and the tabs, not the page
        return render(request, "runs/detail.html#window", context)
    lineage = {
        "parent": Run.objects.filter(id=run.parent_id).only("id", "agent", "status").first() if run.parent_id else None,
        "forked_from": (Run.objects.filter(id=run.forked_from_id).only("id", "agent", "status").first()
                        if run.forked_from_id else None),
        "children": list(run.children.only("id", "agent", "status").order_by("created_at")[:50]),
        "forks": list(run.forks.only("id", "agent", "status", "fork_step").order_by("created_at")[:50]),
    }
    context.update({
        "lineage": lineage,
        "in_doubt": SideEffect.objects.filter(run=run, status="started").order_by("position").first(),
        "approval": _pending_approval(run),
        "thread": thread_view(run),  # a run that drives a LangGraph graph: its thread's newest checkpoint
    })
    refused = {a: refusal(run, a) for a in LIFECYCLE}
    context["allowed"] = {a for a, why in refused.items() if not why}
    context["not_offered"] = [(a, why) for a, why in refused.items() if why]
    return render(request, "runs/detail.html", context)


def _window_context(request: HttpRequest, run: Run, step, total: int) -> dict:
    """The timeline and the tabs for the window of steps the page shows, with their totals.

    A fixed number of indexed queries, however long the journal: COUNTs on (run, ...) indexes for the
    totals, ranges on (run, position) and (run, seq) for the rows.
    """
    center = step.position if step else 1
    win = window.window_for(total, center, parse_int(request.GET.get("from"), minimum=1),
                            parse_int(request.GET.get("to"), minimum=1))
    newest = _newest_seq(run)
    span_total = TraceSpan.objects.filter(run=run).count()
    checkpoint_total = Checkpoint.objects.filter(run=run).count()
    if total:
        rows, window_spans, aggregated = window.timeline_rows(run.id, win)
        spans, checkpoints = window.trace_rows(run.id, win), window.checkpoint_rows(run.id, win)
        after, until = window.event_bounds(run.id, win, newest)
    else:  # nothing has a position yet: the run's own spans and events, from the start
        rows = list(TraceSpan.objects.filter(run=run).order_by("started_at", "id").values(
            "name", "kind", "position", "attempt", "status", "started_at", "ended_at", "duration_ms")
            [:window.AGGREGATE_ABOVE])
        window_spans, aggregated, spans, checkpoints, after, until = len(rows), False, [], [], 0, newest
    events = list(SessionEvent.objects.filter(run=run, seq__gt=after, seq__lte=until).order_by("seq")[:EVENTS_PAGE])
    return {
        "window": win, "window_spans": window_spans, "aggregated": aggregated,
        "gantt": charts.waterfall(rows, aggregated=aggregated, current=center if total else None) if rows else None,
        "spans": spans, "span_total": span_total, "checkpoints": checkpoints, "checkpoint_total": checkpoint_total,
        "events": events, "events_after": after, "last_seq": newest, "until": until,
        "next_after": _next_after(events, until), "tab_rows": window.TAB_ROWS,
    }


def _newest_seq(run: Run) -> int:
    """Where the live tail starts and how many events the run has (seq is dense): one row off the
    (run, seq) index."""
    return SessionEvent.objects.filter(run=run).order_by("-seq").values_list("seq", flat=True).first() or 0


def _capped(qs) -> tuple[list, int]:
    """The first TAB_ROWS rows and how many there are in all (a COUNT only when the cap was reached)."""
    rows = list(qs[:TAB_ROWS])
    return rows, (qs.count() if len(rows) == TAB_ROWS else len(rows))


def _next_after(events: list[SessionEvent], until: int) -> int | None:
    """The cursor of the next events page (None when this page reached ``until``, the newest at page load)."""
    if len(events) == EVENTS_PAGE and events[-1].seq < until:
        return events[-1].seq
    return None


@require_GET
@viewer_required
def run_events(request: HttpRequest, run_id) -> HttpResponse:
    """One page of the events list after the ``after`` seq cursor, up to ``until`` (where the live tail took
    over when the page was drawn): the rows and a button for the next page."""
    run = get_run_or_404(run_id, fields=("id", "status"))
    after, until = _int(request.GET.get("after"), 0), _int(request.GET.get("until"), 0)
    events = list(SessionEvent.objects.filter(run_id=run.id, seq__gt=after, seq__lte=until)
                  .order_by("seq")[:EVENTS_PAGE])
    return render(request, "runs/detail.html#events_page",
                  {"run": run, "events": events, "next_after": _next_after(events, until), "until": until})


def _pending_approval(run: Run):
    """The approval this run waits for (the engine's inbox, narrowed to the run)."""
    return pending_approvals().filter(run=run).first()


@require_GET
@viewer_required
def run_header(request: HttpRequest, run_id) -> HttpResponse:
    """The header fragment, polled while the run is live; 286 stops the polling once it is terminal."""
    run = get_run_or_404(run_id)
    response = render(request, "runs/detail.html#header", {"run": run, "total_steps": stepper.total_steps(run)})
    if run.is_terminal:
        return HttpResponseStopPolling(response.content)
    return response


@require_GET
@viewer_required
def run_tail(request: HttpRequest, run_id) -> HttpResponse:
    """Events after the ``after`` seq cursor: only new rows, appended to the event list."""
    run = get_run_or_404(run_id, fields=("id", "status"))
    after = _int(request.GET.get("after"), 0)
    events = list(SessionEvent.objects.filter(run_id=run.id, seq__gt=after).order_by("seq")[:TAIL_ROWS])
    last_seq = events[-1].seq if events else after
    response = render(request, "runs/detail.html#tail", {"run": run, "events": events, "last_seq": last_seq})
    if run.is_terminal and len(events) < TAIL_ROWS:
        return HttpResponseStopPolling(response.content)
    return response


@require_GET
@viewer_required
def event_payload(request: HttpRequest, run_id, seq: int) -> HttpResponse:
    """One event's full payload as JSON (for payloads too big to inline): served as data, never HTML."""
    run = get_run_or_404(run_id, fields=("id",))
    event = SessionEvent.objects.filter(run_id=run.id, seq=seq).first()
    if event is None:
        return JsonResponse({"error": f"run {run.id} has no event {seq}"}, status=404)
    response = HttpResponse(json.dumps(event.payload, indent=2, default=str), content_type="application/json")
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = f'inline; filename="{run.id}-{seq}.json"'
    return response
