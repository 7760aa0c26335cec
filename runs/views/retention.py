"""Retention (admins): keep-days per agent and status, a preview of what a purge deletes, purge now.

The rules are the engine's (journal.operations.retention); this page only calls its functions.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from journal.models import TERMINAL_STATUSES, RetentionRule
from journal.operations import retention
from runs.permissions import admin_required, admin_write_required, read_only
from runs.queries import agent_choices
from runs.views.common import parse_int, perform

MAX_KEEP_DAYS = 36_500  # a century: anything longer is "forever", which is no rule at all
MAX_AGENT = 200  # RetentionRule.agent's length


@require_GET
@admin_required
def retention_page(request: HttpRequest) -> HttpResponse:
    context = {
        "rules": list(RetentionRule.objects.all()),
        "preview": retention.preview(),
        "statuses": sorted(TERMINAL_STATUSES),
        "agents": sorted({name for name, _version in agent_choices()}),
        "read_only": read_only(),
    }
    return render(request, "runs/retention.html", context)


@require_POST
@admin_write_required
def retention_set(request: HttpRequest) -> HttpResponse:
    agent = request.POST.get("agent", "").strip()
    status = request.POST.get("status", "")
    keep_days = parse_int(request.POST.get("keep_days", ""), minimum=1, maximum=MAX_KEEP_DAYS)
    error = _rule_error(agent, keep_days)
    if error:
        messages.error(request, error)
        return redirect("retention")
    outcome = perform(request, "retention_set", lambda: retention.set_rule(
        agent=agent, status=status, keep_days=keep_days, actor=request.user.get_username()),
        target=f"{agent or 'every agent'} / {status or 'every finished status'}",
        describe=lambda rule: f"kept: {rule}")
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect("retention")


def _rule_error(agent: str, keep_days: int | None) -> str:
    """Why the form cannot become a rule ("" when it can), for what the engine leaves to its columns to
    refuse (an integer past the column's range, a name longer than it): the status is the engine's check."""
    if keep_days is None:
        return f"keep days must be a whole number from 1 to {MAX_KEEP_DAYS}"
    if len(agent) > MAX_AGENT:
        return f"an agent name has at most {MAX_AGENT} characters"
    return ""


@require_POST
@admin_write_required
def retention_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    outcome = perform(request, "retention_delete",
                      lambda: retention.delete_rule(rule_id, actor=request.user.get_username()),
                      target=f"rule {rule_id}", describe=lambda label: f"removed: {label}")
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect("retention")


@require_POST
@admin_write_required
def retention_purge(request: HttpRequest) -> HttpResponse:
    outcome = perform(request, "retention_purge", retention.purge, target="all rules",
                      comment=request.POST.get("comment", ""), describe=lambda n: f"purged {n} finished run(s)")
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect("retention")
