"""Who may do what: one decorator per capability, checked on every view and action.

Views are plain functions wrapped in exactly one of these; the table in tests/test_authz.py
pins down what each role may reach.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from runs.roles import ACT, MANAGE, VIEW


def read_only() -> bool:
    """settings.DURABLE_READ_ONLY turns the whole UI into a viewer: every write is refused."""
    return bool(getattr(settings, "DURABLE_READ_ONLY", False))


def _requires(perm: str, *, write: bool) -> Callable:
    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not request.user.has_perm(perm):
                raise PermissionDenied(f"your role does not allow this (needs {perm.split('.')[1]})")
            if write and read_only():
                raise PermissionDenied("the dashboard is read-only (DURABLE_READ_ONLY): no changes can be made")
            return view(request, *args, **kwargs)

        wrapper.required_permission = perm  # type: ignore[attr-defined]
        return wrapper

    return decorate


def viewer_required(view: Callable) -> Callable:
    """Any dashboard role may read."""
    return _requires(VIEW, write=False)(view)


def operator_required(view: Callable) -> Callable:
    """Acting on runs: operators and admins, never while read-only."""
    return _requires(ACT, write=True)(view)


def admin_required(view: Callable) -> Callable:
    """Reading admin pages (settings, roles)."""
    return _requires(MANAGE, write=False)(view)


def admin_write_required(view: Callable) -> Callable:
    """Changing settings: admins, never while read-only."""
    return _requires(MANAGE, write=True)(view)


def operator_read_required(view: Callable) -> Callable:
    """Pages for operators that change nothing (the audit log): still readable when read-only."""
    return _requires(ACT, write=False)(view)
