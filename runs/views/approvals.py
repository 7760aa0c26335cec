"""The approvals inbox: runs waiting for a person, oldest first, and the decision endpoint.

Two kinds of waits are decisions: an approval (``ctx.request_approval``: journal.models.Approval,
decided with ``journal.decide``), and a run suspended on ``ctx.wait_for_signal`` (answered by
sending that signal). Both show here so an on-call operator has one place to look.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from journal.models import Approval, Run, RunStatus
from journal.operations.approvals import pending_approvals as engine_pending_approvals
from runs.permissions import operator_required, viewer_required
from runs.roles import roles_of
from runs.views.common import Outcome, as_uuid, get_run_or_404, parse_json_field, perform

INBOX_ROWS = 200
DECISIONS = ("accept", "edit", "reject", "respond")


def pending_approvals():
    """The engine's inbox (open approvals of runs that can still use them, oldest first), with the votes."""
    return list(engine_pending_approvals().prefetch_related("decisions")[:INBOX_ROWS])


def signal_waits():
    return list(Run.objects.filter(status=RunStatus.SUSPENDED, waiting_for__kind="signal")
                .defer("output", "error").order_by("updated_at", "id")[:INBOX_ROWS])


def pending_count() -> int:
    """For the navigation badge: two indexed COUNTs, whatever the page."""
    return (Run.objects.filter(status=RunStatus.SUSPENDED, waiting_for__kind="signal").count()
            + engine_pending_approvals().count())


@require_GET
@viewer_required
def badge(request: HttpRequest) -> HttpResponse:
    """The navigation's count of waiting decisions, polled so it stays true without a reload."""
    return render(request, "base.html#badge", {"approvals_badge": pending_count()})


@require_GET
@viewer_required
def inbox(request: HttpRequest) -> HttpResponse:
    context = {"approvals": pending_approvals(), "waits": signal_waits()}
    if request.htmx and request.GET.get("fragment") == "list":
        return render(request, "runs/approvals.html#inbox", context)
    return render(request, "runs/approvals.html", context)


def _form_error(decision: str, comment: str, edited, approval_id: str, run_id: str) -> str:
    """Why the decision form cannot be acted on ("" when it can), before any id reaches a query."""
    if decision not in DECISIONS:
        return f"decision must be one of {', '.join(DECISIONS)}"
    if decision == "respond" and not comment:
        return "write the response in the comment box"
    if decision == "edit" and edited is None:
        return "edit-then-accept needs the edited value (JSON)"
    if approval_id and as_uuid(approval_id) is None:
        return f"{approval_id[:40]!r} is not an approval id"
    if not approval_id and as_uuid(run_id) is None:
        return "the form names neither an approval nor a run waiting for a signal"
    return ""


@require_POST
@operator_required
def decide(request: HttpRequest) -> HttpResponse:
    """accept / edit-then-accept / reject / respond, for an approval or a signal wait."""
    import journal

    decision = request.POST.get("decision", "")
    comment = request.POST.get("comment", "").strip()[:4000]
    actor = request.user.get_username()
    edited, error = parse_json_field(request.POST.get("edited", ""), "the edited value")
    approval_id = request.POST.get("approval_id", "").strip()
    run_id = request.POST.get("run_id", "")
    error = error or _form_error(decision, comment, edited, approval_id, run_id)
    outcome: Outcome
    if error:
        outcome = Outcome(False, error)
    elif approval_id:
        approved = decision in ("accept", "edit")
        roles = roles_of(request.user)

        def call():
            return journal.decide(approval_id, approved=approved, actor=actor, actor_roles=roles,
                                  comment=comment, edited=edited if decision == "edit" else None)

        row = Approval.objects.filter(id=as_uuid(approval_id)).only("run_id").first()
        outcome = perform(request, f"approval_{decision}", call, run_id=row.run_id if row else None,
                          target=f"approval {approval_id}", comment=comment,
                          describe=lambda r: f"{decision}ed" if decision != "edit" else "edited and accepted")
    else:
        run = get_run_or_404(run_id)
        name = (run.waiting_for or {}).get("name", "") if isinstance(run.waiting_for, dict) else ""
        if not name:
            outcome = Outcome(False, "this run is no longer waiting for a signal")
        else:
            payload = {"approved": decision in ("accept", "edit"), "decision": decision, "comment": comment,
                       "by": actor}
            if decision == "edit":
                payload["edited"] = edited
            outcome = perform(request, f"approval_{decision}",
                              lambda: journal.signal(run.id, name, payload, actor=actor), run_id=run.id,
                              target=f"signal {name}", comment=comment, describe=lambda r: f"{decision}: sent")
    if request.htmx:
        context = {"approvals": pending_approvals(), "waits": signal_waits(), "outcome": outcome}
        return render(request, "runs/approvals.html#inbox", context)
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    back = request.POST.get("next", "")
    return redirect(back if back.startswith("/") and not back.startswith("//") else "approvals")
