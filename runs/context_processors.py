"""Navigation context on every page: the user's role, the read-only switch, the approvals badge."""

from __future__ import annotations

from django.http import HttpRequest

from runs.permissions import read_only
from runs.roles import role_of


def dashboard(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    role = role_of(user) if user is not None else ""
    context = {"role": role, "read_only": read_only(), "can_act": role in ("operator", "admin") and not read_only(),
               "is_admin": role == "admin"}
    if role:
        from runs.views.approvals import pending_count

        context["approvals_badge"] = _lazy_count(pending_count)
    return context


class _lazy_count:  # noqa: N801 - used as a value in templates
    """Counted only if the template shows the badge (the login page never does)."""

    def __init__(self, fn):
        self.fn = fn
        self.value = None

    def __str__(self) -> str:
        if self.value is None:
            self.value = self.fn()
        return str(self.value)

    def __int__(self) -> int:
        str(self)
        return int(self.value)

    def __bool__(self) -> bool:
        return int(self) > 0
