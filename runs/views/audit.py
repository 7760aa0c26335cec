"""The audit log (who did what, when, on which run, with what comment) and the admins' roles page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.models import Group, User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from runs.models import AuditEntry
from runs.permissions import admin_required, admin_write_required, operator_read_required, read_only
from runs.roles import ROLE_NAMES
from runs.views.common import as_uuid, parse_int, perform

AUDIT_PAGE = 100


@require_GET
@operator_read_required
def audit_log(request: HttpRequest) -> HttpResponse:
    qs = AuditEntry.objects.all()
    actor = request.GET.get("actor", "").strip()[:150]
    run = request.GET.get("run", "").strip()[:40]
    if actor:
        qs = qs.filter(actor=actor)
    if run:
        run_id = as_uuid(run)
        if run_id is None:
            messages.error(request, f"{run!r} is not a run id")
        else:
            qs = qs.filter(run_id=run_id)
    before = request.GET.get("before", "")
    if before:
        cursor = parse_int(before, minimum=1)
        if cursor is None:
            messages.error(request, "the page link is damaged; showing the newest entries")
        else:
            qs = qs.filter(id__lt=cursor)
    entries = list(qs.order_by("-id")[: AUDIT_PAGE + 1])
    more = len(entries) > AUDIT_PAGE
    entries = entries[:AUDIT_PAGE]
    q = request.GET.copy()
    q.pop("before", None)
    if more:
        q["before"] = entries[-1].id
    return render(request, "runs/audit.html", {"entries": entries, "actor": actor, "run": run,
                                               "next_query": q.urlencode() if more else ""})


@require_GET
@admin_required
def roles(request: HttpRequest) -> HttpResponse:
    users = list(User.objects.order_by("username").prefetch_related("groups")[:500])
    rows = []
    for u in users:
        names = {g.name for g in u.groups.all()}
        rows.append({"user": u, "role": next((r for r in reversed(ROLE_NAMES) if r in names), "")})
    return render(request, "runs/roles.html", {"rows": rows, "role_names": ROLE_NAMES, "read_only": read_only()})


@require_POST
@admin_write_required
def set_role(request: HttpRequest) -> HttpResponse:
    username = request.POST.get("username", "")[:150]
    role = request.POST.get("role", "")
    user = User.objects.filter(username=username).first() if username else None
    if user is None or (role and role not in ROLE_NAMES):
        messages.error(request, "choose an existing user and one of the roles")
        return redirect("roles")

    def change():
        groups = Group.objects.filter(name__in=ROLE_NAMES)
        user.groups.remove(*groups)
        if role:
            user.groups.add(Group.objects.get(name=role))
        return role

    outcome = perform(request, "role_change", change, target=f"user {username}",
                      describe=lambda r: f"{username} is now {r or 'without a dashboard role'}")
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect("roles")
