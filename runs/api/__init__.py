"""The HTTP API for automation, mounted at /api/ (OpenAPI schema at /api/openapi.json, docs at /api/docs).

Why django-ninja: the API is a handful of JSON endpoints whose request and response shapes
should be declared once and published as OpenAPI for the people automating against it.
Ninja derives both validation and the schema from type hints (pydantic), runs inside Django
(same ORM, settings, URLconf; no second framework), and its exception handlers let every
engine error map to one JSON error shape. Django REST framework would bring serializers,
viewsets and a browsable API we do not need for a score of endpoints.

The API holds no engine logic: each endpoint checks the caller's scope and calls journal's public
functions (start_run, signal, decide, get_run, cancel, pause, unpause, retry, resume, compensate,
fork, replay_check, resolve_effect, state_at), which record the actor; operator actions also write
the dashboard's audit entry (runs.models.AuditEntry) with the token's actor. The runs list reuses the
runs page's filters and keyset pages (runs.queries).
"""

from runs.api.endpoints import api

__all__ = ["api"]
