"""Shared helpers for views: fetch a run or 404, call the engine and audit the outcome."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest

from journal.models import Run
from runs.models import AuditEntry

NOT_AVAILABLE = (AttributeError, ImportError, NotImplementedError)


def get_run_or_404(run_id: Any, *, fields: tuple[str, ...] | None = None) -> Run:
    qs = Run.objects.all()
    if fields:
        qs = qs.only(*fields)
    try:
        return qs.get(id=run_id)
    except (Run.DoesNotExist, ValueError):
        raise Http404(f"no run with id {run_id}") from None


@dataclass
class Outcome:
    ok: bool
    message: str
    value: Any = None


def perform(request: HttpRequest, action: str, call: Callable[[], Any], *, run_id: Any = None, target: str = "",
            comment: str = "", describe: Callable[[Any], str] | None = None) -> Outcome:
    """Call one engine function for the signed-in user, and audit it whatever happens.

    Engine errors (journal.DurableError) are the user's business: their message is shown in place.
    A function another engineer has not shipped yet reads as "not available", never a 500.
    """
    from journal import DurableError

    try:
        value = call()
    except DurableError as exc:
        outcome = Outcome(False, str(exc))
    except NOT_AVAILABLE as exc:
        outcome = Outcome(False, f"{action} is not available in this installation ({type(exc).__name__}: {exc})")
    else:
        outcome = Outcome(True, describe(value) if describe else f"{action}: done", value)
    AuditEntry.objects.create(actor=request.user.get_username(), action=action, run_id=run_id, target=target[:300],
                              comment=comment, ok=outcome.ok, result=outcome.message[:4000])
    return outcome


def parse_json_field(text: str, what: str) -> tuple[Any, str]:
    """(value, "") or (None, error message): the server-side half of the JSON editor's validation."""
    text = (text or "").strip()
    if not text:
        return None, ""
    try:
        return json.loads(text), ""
    except json.JSONDecodeError as exc:
        return None, f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
