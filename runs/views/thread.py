"""A run's LangGraph thread on its page: the thread's checkpoints one at a time, windowed.

The engine's bridge (``journal.checkpoint_state``) decodes one checkpoint and its parent per request;
this module only shapes it (the diff, a window of neighbouring checkpoints) for ``runs/_thread.html``.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

import journal
from runs.diffing import json_diff
from runs.permissions import viewer_required
from runs.views.common import get_run_or_404, parse_int

WINDOW = 5  # checkpoints listed on either side of the current one


def thread_view(run, position: int | None = None) -> dict[str, Any] | None:
    """What the thread card shows at ``position`` (1-based; default the newest), or None for a run
    that drives no graph."""
    if not journal.has_thread(run):
        return None
    total = journal.thread_total(run)
    position = total if position is None else max(1, min(position, total))
    try:
        at = journal.checkpoint_state(run, position=position)
    except (journal.DurableError, LookupError) as exc:  # e.g. a value erased from the blob store: say so, no 500
        return {"position": position, "total": total, "error": str(exc), "window": [], "values": {}}
    offset = max(0, position - 1 - WINDOW)
    return {**at, "changes": json_diff(at["previous_values"], at["values"]),
            "prev": position - 1 if position > 1 else None, "next_position": position + 1 if position < total else None,
            "window": journal.thread_checkpoints(run, offset=offset, limit=2 * WINDOW + 1)}


@require_GET
@viewer_required
def run_thread(request: HttpRequest, run_id) -> HttpResponse:
    run = get_run_or_404(run_id)
    thread = thread_view(run, parse_int(request.GET.get("checkpoint"), minimum=1))
    if thread is None:
        raise Http404(f"run {run.id} drives no LangGraph graph")
    return render(request, "runs/_thread.html", {"run": run, "thread": thread})
