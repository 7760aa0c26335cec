"""Erasure (admins): a subject's or some runs' data erased on request, after a preview.

Enter a subject or run ids -> the preview (which runs, how many events, files and blobs, which runs
are refused and why) -> confirm with a reason -> the result. The engine does the work
(``journal.erase``); this page audits it with the actor, one entry for the request and one per run.
The audit log never names the subject: the request's entry carries the first characters of its
SHA-256, as the engine's Erasure record does.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

import journal
from journal.models import Erasure
from runs.models import AuditEntry
from runs.permissions import admin_required, admin_write_required, read_only
from runs.views.common import perform

MAX_SUBJECT = 200
MAX_RUN_IDS = 1000


def _asked(data) -> tuple[str, list[str]]:
    """(subject, run ids) as the form sent them."""
    subject = (data.get("subject") or "").strip()[:MAX_SUBJECT + 1]
    run_ids = [r for r in re.split(r"[\s,;]+", data.get("runs") or "") if r][:MAX_RUN_IDS]
    return subject, run_ids


def _call_args(subject: str, run_ids: list[str]) -> dict:
    return {"subject": subject or None, "run_ids": run_ids or None}


@require_GET
@admin_required
def erasure_page(request: HttpRequest) -> HttpResponse:
    subject, run_ids = _asked(request.GET)
    context = {"subject": subject, "runs_text": "\n".join(run_ids), "read_only": read_only(),
               "recent": list(Erasure.objects.all()[:20])}
    done = request.GET.get("done", "")
    if done:
        context["done"] = Erasure.objects.filter(id=done).first() if re.fullmatch(r"[0-9a-f-]{36}", done) else None
    if subject or run_ids:
        try:
            context["preview"] = journal.preview_erasure(**_call_args(subject, run_ids))
        except journal.DurableError as exc:
            context["error"] = str(exc)
    return render(request, "runs/erasure.html", context)


@require_POST
@admin_write_required
def erasure_erase(request: HttpRequest) -> HttpResponse:
    subject, run_ids = _asked(request.POST)
    reason = (request.POST.get("reason") or "").strip()
    back = reverse("erasure") + "?" + urlencode({"subject": subject} if subject else {"runs": ",".join(run_ids)})
    if not subject and not run_ids:
        messages.error(request, "enter a subject or run ids")
        return redirect("erasure")
    if not reason:
        messages.error(request, "a reason is required (e.g. the request's reference): it is kept with the erasure")
        return redirect(back)
    target = (f"subject sha256:{hashlib.sha256(subject.encode()).hexdigest()[:16]}" if subject
              else f"{len(run_ids)} run(s)")
    outcome = perform(request, "erase", lambda: journal.erase(
        **_call_args(subject, run_ids), actor=request.user.get_username(), reason=reason),
        target=target, comment=reason,
        describe=lambda report: f"erasure {report.erasure_id}: {len(report.run_ids)} run(s), {report.events} "
                                f"event(s), {report.blobs_deleted} blob(s) deleted")
    if not outcome.ok:
        messages.error(request, outcome.message)
        return redirect(back)
    report = outcome.value
    AuditEntry.objects.bulk_create([
        AuditEntry(actor=request.user.get_username(), action="erase", run_id=run_id, target=target, comment=reason,
                   result=f"erasure {report.erasure_id}") for run_id in report.run_ids])
    messages.success(request, outcome.message)
    return redirect(reverse("erasure") + f"?done={report.erasure_id}")
