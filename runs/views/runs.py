"""The runs list: filters and sort in the URL, keyset pages, a tiny live fragment, bulk actions."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseStopPolling

from journal.models import LIVE_STATUSES, TERMINAL_STATUSES, Run, RunStatus
from journal.operations.runs import refusal
from runs import bulk, queries
from runs.models import BulkJob
from runs.permissions import operator_required, viewer_required
from runs.views.common import as_uuid, perform

MAX_LIVE_IDS = 200
BULK_ACTIONS = set(bulk.ACTIONS)
FILTER_CAP = 1000  # runs acted on in one request (selected); a larger search goes to a background job
FILTER_FIELDS = ("q", "status", "agent", "version", "since", "until")


@require_GET
@viewer_required
def run_list(request: HttpRequest) -> HttpResponse:
    f = queries.RunFilter.from_query(request.GET)
    try:
        page = queries.runs_page(f, after=request.GET.get("after", ""), before=request.GET.get("before", ""))
    except queries.FilterError as exc:
        f.errors.append(str(exc))
        page = queries.runs_page(f)
    base = request.GET.copy()
    for key in ("after", "before"):
        base.pop(key, None)
    sort_links = {}
    for key in queries.SORTS:
        q = base.copy()
        q["sort"] = key if f.sort == f"-{key}" else f"-{key}"
        sort_links[key] = q.urlencode()
    context = {
        "filter": f, "page": page, "statuses": RunStatus.choices, "agents": queries.agent_choices(),
        "query": base.urlencode(), "sort_links": sort_links,
        "next_query": _with(base, after=page.next_cursor), "prev_query": _with(base, before=page.prev_cursor),
        "live_ids": ",".join(page.live_ids), "search_keys": queries.SEARCH_KEYS,
        "filter_fields": [(k, v) for k in FILTER_FIELDS for v in request.GET.getlist(k) if v],
    }
    return render(request, "runs/list.html", context)


def _with(base, **cursor) -> str:
    q = base.copy()
    for key, value in cursor.items():
        if not value:
            return ""
        q[key] = value
    return q.urlencode()


@require_GET
@viewer_required
def run_list_live(request: HttpRequest) -> HttpResponse:
    """Status and progress of the live runs on the current page, as out-of-band swaps.

    Returns 286 (htmx: stop polling) once none of them is live any more.
    """
    ids = [rid for rid in map(as_uuid, request.GET.get("ids", "").split(",")[:MAX_LIVE_IDS]) if rid]
    runs = []
    if ids:  # a malformed id in the query string is skipped, not an error
        runs = list(Run.objects.filter(id__in=ids).only("id", "status", "progress", "steps", "paused",
                                                      "error", "attention_reason"))
    response = render(request, "runs/list.html#live", {"runs": runs, "oob": True})
    if not any(r.status in LIVE_STATUSES for r in runs):
        stop = HttpResponseStopPolling(response.content)
        return stop
    return response


@require_POST
@operator_required
def bulk_action(request: HttpRequest) -> HttpResponse:
    """Cancel, retry or compensate the selected runs (the form asks for confirmation first)."""
    action = request.POST.get("action", "")
    ids = request.POST.getlist("run_ids")[:FILTER_CAP]
    reason = request.POST.get("reason", "").strip()[:500]
    back = request.POST.get("next", "")
    if not back.startswith("/") or back.startswith("//"):
        back = "/"
    if action not in BULK_ACTIONS:
        messages.error(request, f"unknown bulk action {action!r}")
        return redirect(back)
    if request.POST.get("scope") == "filter":  # every run matching the search, not the ticked ones
        f = queries.RunFilter.from_query(request.POST)
        if f.errors:
            return _filter_answer(request, action, back, error="; ".join(f.errors))
        matching = f.apply(Run.objects.all())
        if request.POST.get("dry_run") == "1":
            return _filter_answer(request, action, back, by_status=dict(
                matching.order_by().values_list("status").annotate(n=Count("id"))))
        inline = int(getattr(settings, "DASHBOARD_BULK_INLINE_MAX", 20))
        ids = [str(i) for i in matching.order_by("created_at", "id").values_list("id", flat=True)[:inline + 1]]
        if len(ids) > inline:  # more than a handful: in the background, with its progress on a page
            job = bulk.create_job(actor=request.user.get_username(), action=action, reason=reason,
                                  params=bulk.params_of(request.POST), total=matching.count())
            return redirect(reverse("bulk_job", args=[job.id]))
    if not ids:
        messages.warning(request, "select at least one run first" if request.POST.get("scope") != "filter"
                         else "no run matches this search")
        return redirect(back)
    actor = request.user.get_username()
    parsed = {text: as_uuid(text) for text in ids}
    runs = {r.id: r for r in Run.objects.filter(id__in=[rid for rid in parsed.values() if rid])
            .only("id", "status", "paused")}
    done, requested, failed = 0, 0, []
    skipped: dict[str, int] = {}
    for text, rid in parsed.items():
        if rid is None:  # never handed to the engine: it is not a run id at all
            failed.append(f"{text[:40]!r} is not a run id")
            continue
        run = runs.get(rid)
        if run is None:
            failed.append(f"{str(rid)[:8]}: no such run")
            continue
        why = refusal(run, action)
        if why:  # the engine would refuse: counted, not an error
            why = why.removeprefix("it is ")
            skipped[why] = skipped.get(why, 0) + 1
            continue
        outcome = perform(request, action, lambda rid=rid: bulk.call(action, rid, actor, reason), run_id=rid,
                          comment=reason, target="bulk")
        if not outcome.ok:
            failed.append(f"{str(rid)[:8]}: {outcome.message}")
        elif action == "cancel" and getattr(outcome.value, "status", None) not in TERMINAL_STATUSES:
            requested += 1  # a worker holds it: it stops at its next step boundary
        else:
            done += 1
    messages_for_bulk(request, action, done, requested, skipped, failed)
    return redirect(back)


def _filter_answer(request, action: str, back: str, *, by_status: dict | None = None, error: str = ""):
    """The count first: how many runs the search matches, by status, and nothing done yet."""
    by_status = by_status or {}
    total = sum(by_status.values())
    if not request.htmx:
        if error:
            return JsonResponse({"error": error}, status=400)
        return JsonResponse({"action": action, "count": total, "by_status": by_status, "dry_run": True})
    return render(request, "runs/list.html#filter_bulk", {
        "action": action, "count": total, "by_status": sorted(by_status.items()), "error": error,
        "filter_fields": [(k, v) for k in FILTER_FIELDS for v in request.POST.getlist(k)],
        "reason": request.POST.get("reason", ""), "back": back})


PAST = {"cancel": "cancelled", "retry": "retry scheduled", "compensate": "compensation started", "pause": "paused",
        "resume": "resumed"}


@require_GET
@viewer_required
def bulk_job(request: HttpRequest, job_id) -> HttpResponse:
    """A background bulk action's page: its progress, polled until it finishes, and the refused runs."""
    job = get_object_or_404(BulkJob, id=job_id)
    if not job.finished:
        bulk.ensure_running(job.id)  # its thread died with a web restart: carry on from the cursor
        job.refresh_from_db()
    partial = "runs/bulk_job.html#progress" if request.htmx else "runs/bulk_job.html"
    response = render(request, partial, {"job": job})
    if request.htmx and job.finished:
        return HttpResponseStopPolling(response.content)
    return response


def messages_for_bulk(request, action: str, done: int, requested: int, skipped: dict[str, int],
                      failed: list[str]) -> None:
    if done:
        messages.success(request, f"{action}: {done} run(s) {PAST[action]}")
    if requested:
        messages.info(request, f"cancel: cancellation requested for {requested} running run(s); "
                               "each stops at its next step boundary")
    if skipped:
        parts = (next(iter(skipped)) if len(skipped) == 1
                 else ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())))
        messages.warning(request, f"{action}: {sum(skipped.values())} skipped: {parts}")
    for line in failed[:20]:
        messages.error(request, line)
