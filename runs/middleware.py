"""Refuse a request carrying a NUL character before any view or query sees it.

NUL (``%00``) is never meaningful in a URL, a query parameter, a form field or a cookie here, and
PostgreSQL cannot even compare text containing it: psycopg raises DataError on the first query
that uses the value — an agent name in a path, a search box, a username, a session cookie — which
would be a 500 on PostgreSQL and silently fine on SQLite. One check at the door answers 400 on
both, for every present and future view, instead of a guard in each one. (JSON typed into a form
may still spell "\\u0000" as text; runs.views.common.parse_json_field refuses that value.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.urls import NoReverseMatch, reverse

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class RefuseNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = _where_nul(request)
        if where:
            return _bad_request(request, f"the {where} contains a NUL character")
        return self.get_response(request)


def _api_prefix() -> str:
    try:
        return reverse("api:api-root")
    except NoReverseMatch:
        return "/api/"


def _has_nul(pairs: Iterable[tuple[str, list[str]]]) -> bool:
    return any("\x00" in key or any("\x00" in v for v in values) for key, values in pairs)


def _where_nul(request: HttpRequest) -> str:
    if "\x00" in request.path:
        return "URL"
    if _has_nul(request.GET.lists()):
        return "query string"
    if _has_nul((k, [v]) for k, v in request.COOKIES.items()):
        return "cookie"
    # The API reads its own JSON body; parsing it here as a form would consume a multipart stream.
    if (request.method == "POST" and request.content_type in FORM_TYPES
            and not request.path.startswith(_api_prefix()) and _has_nul(request.POST.lists())):
        return "form"
    return ""


def _bad_request(request: HttpRequest, message: str) -> HttpResponse:
    """The API's documented error shape under /api/, a plain 400 for the dashboard."""
    if request.path.startswith(_api_prefix()):
        return JsonResponse({"detail": message, "code": "bad_request"}, status=400)
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
