"""Shared helpers for views: fetch a run or 404, call the engine and audit the outcome."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from journal.models import Run
from runs.models import AuditEntry
from runs.validation import unstorable

NOT_AVAILABLE = (AttributeError, ImportError, NotImplementedError)


# Integers a form may carry into a query: what both databases' 64-bit columns can compare against.
# (Python's int() also takes "²"-like digits, underscores and any size: SQLite overflows, PostgreSQL errors.)
INT_LIMIT = 2**63 - 1
_ASCII_INT = re.compile(r"[+-]?[0-9]{1,19}")


def parse_int(text: Any, *, minimum: int = -INT_LIMIT, maximum: int = INT_LIMIT) -> int | None:
    """``text`` as an int within [minimum, maximum], or None: ASCII digits only, never an exception."""
    if not isinstance(text, str) or not _ASCII_INT.fullmatch(text.strip()):
        return None
    value = int(text)
    return value if minimum <= value <= maximum else None


def as_uuid(text: Any) -> uuid.UUID | None:
    """A run/approval id from a form or query string, or None when it is not one."""
    if isinstance(text, uuid.UUID):
        return text
    try:
        return uuid.UUID(str(text).strip())
    except ValueError:
        return None


def get_run_or_404(run_id: Any, *, fields: tuple[str, ...] | None = None) -> Run:
    """The run, or 404 for an unknown id and for text that is not an id at all."""
    rid = as_uuid(run_id)
    qs = Run.objects.all()
    if fields:
        qs = qs.only(*fields)
    run = qs.filter(id=rid).first() if rid else None
    if run is None:
        raise Http404(f"no run with id {run_id}")
    return run


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
    """(value, "") or (None, error message): the server-side half of the JSON editor's validation.

    Refuses, with a message, what JSON allows but neither database can store (NaN and Infinity, which
    PostgreSQL's jsonb rejects; "\\u0000" and lone surrogates, which no text column holds) and values
    nested absurdly deep, so the engine is never handed a value whose write would fail.
    """
    text = (text or "").strip()
    if not text:
        return None, ""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        return None, f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except (ValueError, RecursionError) as exc:
        return None, f"{what} cannot be stored: {exc}"
    problem = unstorable(value)
    return (None, f"{what} cannot be stored: {problem}") if problem else (value, "")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON databases store")


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page says: point them at the static icon (public)."""
    from django.http import HttpResponsePermanentRedirect
    from django.templatetags.static import static

    return HttpResponsePermanentRedirect(static("favicon.svg"))
