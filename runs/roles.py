"""The dashboard's three roles as Django groups: viewer (read), operator (act on runs), admin (settings).

Permissions, not group names, are what views check (runs.permissions), so a site can grant a
capability to its own groups; these three are the defaults that ``manage.py ensure_roles`` creates.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

VIEW = "runs.view_runs"
ACT = "runs.act_on_runs"
MANAGE = "runs.manage_settings"

ROLES: dict[str, tuple[str, ...]] = {
    "viewer": (VIEW,),
    "operator": (VIEW, ACT),
    "admin": (VIEW, ACT, MANAGE),
}
ROLE_NAMES = tuple(ROLES)


def _permission(dotted: str) -> Permission:
    app_label, codename = dotted.split(".", 1)
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def ensure_roles() -> dict[str, Group]:
    """Create (or repair) the three groups with exactly their permissions; idempotent."""
    groups = {}
    for name, perms in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set([_permission(p) for p in perms])
        groups[name] = group
    return groups


def role_of(user) -> str:
    """The strongest dashboard role a user has ("" for none); superusers are admins."""
    if not getattr(user, "is_authenticated", False):
        return ""
    if user.has_perm(MANAGE):
        return "admin"
    if user.has_perm(ACT):
        return "operator"
    if user.has_perm(VIEW):
        return "viewer"
    return ""


def roles_of(user) -> set[str]:
    """Every role name a user holds, for engine checks such as an approval's required role."""
    if not getattr(user, "is_authenticated", False):
        return set()
    names = set(user.groups.values_list("name", flat=True))
    best = role_of(user)
    if best:
        names.add(best)
    return names
