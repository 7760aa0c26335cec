"""Two runs side by side: the engine aligns their journals (journal.operations.whatif.compare_runs);
this view only finds the two runs and renders what it returns."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from journal.models import Run
from journal.operations.whatif import compare_runs
from runs.permissions import viewer_required
from runs.queries import id_prefix_range
from runs.views.common import as_uuid, parse_int


def _find(text: str, which: str) -> tuple[Run | None, str]:
    """A run by full id or by a unique prefix (the short ids the pages show); else why not."""
    text = (text or "").strip()[:64]
    if not text:
        return None, f"choose run {which}"
    rid = as_uuid(text)
    if rid is not None:
        run = Run.objects.filter(id=rid).first()
        return (run, "") if run else (None, f"run {which}: no run with id {text}")
    span = id_prefix_range(text)
    if span is None:
        return None, f"run {which}: {text!r} is not a run id"
    found = list(Run.objects.filter(id__gte=span[0], id__lte=span[1]).order_by("id")[:2])
    if len(found) != 1:
        return None, f"run {which}: {'no run' if not found else 'more than one run'} starts with {text!r}"
    return found[0], ""


@require_GET
@viewer_required
def compare(request: HttpRequest) -> HttpResponse:
    picked = request.GET.getlist("run_ids")[:2]  # "compare the two selected" from the runs list
    a_text = request.GET.get("a") or (picked[0] if picked else "")
    b_text = request.GET.get("b") or (picked[1] if len(picked) > 1 else "")
    (a, a_error), (b, b_error) = _find(a_text, "A"), _find(b_text, "B")
    errors = [e for e in (a_error, b_error) if e]
    start_text = request.GET.get("from", "").strip()
    start = parse_int(start_text, minimum=1)
    if start_text and start is None:
        errors.append(f"from={start_text[:20]!r} is not a step number")
    result = compare_runs(a, b, start=start) if not errors else None
    return render(request, "runs/compare.html", {"a_text": a_text, "b_text": b_text, "errors": errors,
                                                 "cmp": result, "run_a": a, "run_b": b})
