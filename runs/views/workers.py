"""Harness and workers: agents and their versions, live workers with heartbeats and the runs each
holds; the overview page with its charts; pausing an agent (operators)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from datetime import timedelta

from django.contrib import messages
from django.core.cache import cache
from django.db.models import Count, Max, Sum
from django.db.models.functions import TruncDay
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from journal.models import TERMINAL_STATUSES, AgentPause, Harness, Run, RunStatus, Worker
from journal.operations.workers import live_workers
from runs import charts
from runs.permissions import operator_required, viewer_required
from runs.views.common import perform

OVERVIEW_DAYS = 14
OVERVIEW_CACHE_SECONDS = 300
MAX_AGENT = 200  # Run.agent and AgentPause.agent
DURATION_SAMPLE = 5_000  # the latest finished runs read for percentiles; enough for a daily p95


@require_GET
@viewer_required
def workers(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    harnesses = list(Harness.objects.order_by("name", "-registered_at"))
    counts = defaultdict(dict)
    recent = Run.objects.filter(created_at__gte=now - timedelta(days=OVERVIEW_DAYS))
    for row in recent.values("agent", "version", "status").annotate(n=Count("id")).order_by():
        counts[(row["agent"], row["version"])][row["status"]] = row["n"]
    agents: dict[str, list[dict]] = defaultdict(list)
    for h in harnesses:
        agents[h.name].append({"harness": h, "counts": counts.get((h.name, h.version), {})})
    worker_rows = live_workers(now=now)
    held = defaultdict(list)
    for run in Run.objects.filter(lease_owner__in=[w.id for w in worker_rows]).exclude(lease_owner="") \
            .only("id", "agent", "status", "lease_owner", "lease_expires_at", "steps")[:1000]:
        held[run.lease_owner].append(run)
    recent_dead = list(Worker.objects.exclude(id__in=[w.id for w in worker_rows]).order_by("-heartbeat_at")[:20])
    context = {
        "agents": dict(agents), "workers": [{"worker": w, "runs": held.get(w.id, []),
                                            "age": (now - w.heartbeat_at).total_seconds()} for w in worker_rows],
        "stopped": recent_dead, "paused_agents": _paused_agents(), "days": OVERVIEW_DAYS,
        "frozen_agents": dict(AgentPause.objects.values_list("agent", "paused_by")),
    }
    return render(request, "runs/workers.html", context)


def _paused_agents() -> dict[str, int]:
    """How many live runs of each agent an operator paused (pause_agent pauses them run by run)."""
    return dict(Run.objects.filter(paused=True).exclude(status__in=TERMINAL_STATUSES)
                .values_list("agent").annotate(n=Count("id")).order_by())


@require_POST
@operator_required
def agent_action(request: HttpRequest, agent: str) -> HttpResponse:
    import journal

    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "").strip()[:500]
    actor = request.user.get_username()
    if action not in ("pause_agent", "unpause_agent"):
        messages.error(request, f"unknown agent action {action!r}")
        return redirect("workers")
    if len(agent) > MAX_AGENT:  # longer than any agent's name column: no such agent, and no row to write
        messages.error(request, f"an agent name has at most {MAX_AGENT} characters")
        return redirect("workers")
    outcome = perform(request, action, lambda: getattr(journal, action)(agent, actor=actor, reason=reason),
                      target=f"agent {agent}", comment=reason,
                      describe=lambda n: f"{agent}: {n} run(s) {'paused' if action == 'pause_agent' else 'unpaused'}")
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect("workers")


@require_GET
@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    # Aggregating weeks of runs is the slowest read in the dashboard; the figures are cached under
    # a key that changes whenever any run is created or changes, so they are never stale.
    marks = Run.objects.aggregate(created=Max("created_at"), updated=Max("updated_at"), n=Count("id"))
    stamp = f"{marks['created']}|{marks['updated']}|{marks['n']}"
    key = "runs:overview:" + hashlib.sha256(stamp.encode()).hexdigest()[:32]
    data = cache.get(key)
    if data is None:
        data = _overview_data()
        cache.set(key, data, OVERVIEW_CACHE_SECONDS)
    return render(request, "runs/overview.html", {**data, "days": OVERVIEW_DAYS, "latest": marks["created"]})


def _overview_data() -> dict:
    since = timezone.now() - timedelta(days=OVERVIEW_DAYS)
    recent = Run.objects.filter(created_at__gte=since)
    by_status = [(r["day"], r["status"], r["n"]) for r in recent.annotate(day=TruncDay("created_at"))
                 .values("day", "status").annotate(n=Count("id")).order_by()]
    costs = [(r["day"], r["c"], r["t"]) for r in recent.annotate(day=TruncDay("created_at"))
             .values("day").annotate(c=Sum("cost"), t=Sum("tokens")).order_by()]
    durations = [(created, (finished - started).total_seconds()) for created, started, finished in
                 recent.filter(finished_at__isnull=False, started_at__isnull=False)
                 .order_by("-created_at").values_list("created_at", "started_at", "finished_at")[:DURATION_SAMPLE]]
    totals = dict(Run.objects.filter(status__in=[RunStatus.RUNNING, RunStatus.PENDING, RunStatus.SUSPENDED,
                                                 RunStatus.NEEDS_ATTENTION, RunStatus.FAILED])
                  .values_list("status").annotate(n=Count("id")).order_by())
    figures = {
        "status": charts.runs_by_status(by_status),
        "duration": charts.duration_percentiles(durations),
        "failures": charts.failure_rate(by_status),
        "cost": charts.cost_per_day(costs),
    }
    return {"figures": figures, "totals": totals, "has_data": bool(by_status)}


__all__ = ["workers", "agent_action", "overview"]
