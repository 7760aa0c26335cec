"""Who is calling: bearer tokens with scopes for machines, HMAC-signed deliveries for webhooks.

Every refusal raises before anything is recorded. Body size is checked here, before Ninja
parses the body, so an oversized request is refused with 413 without being read into JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from django.conf import settings
from django.http import HttpRequest
from ninja.security import HttpBearer

from runs.models import ApiToken, WebhookEndpoint

SIGNATURE_HEADER = "X-Durable-Signature"  # "sha256=<hex of HMAC-SHA256(secret, f'{timestamp}.{body}')>"
TIMESTAMP_HEADER = "X-Durable-Timestamp"  # unix seconds when the sender signed
DELIVERY_HEADER = "X-Durable-Delivery"  # optional unique delivery id (else the signature identifies it)
TOLERANCE_SECONDS = 300


class ApiError(Exception):
    """An error the API reports as JSON {"detail": message, "code": code} with ``status``."""

    def __init__(self, status: int, message: str, code: str = ""):
        self.status = status
        self.message = message
        self.code = code or {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                             409: "conflict", 413: "payload_too_large", 422: "invalid"}.get(status, "error")
        super().__init__(message)


def max_body_bytes() -> int:
    return int(getattr(settings, "DURABLE_API_MAX_BODY_BYTES", getattr(settings, "DURABLE_MAX_PAYLOAD_BYTES",
                                                                        1_000_000)))


def check_body_size(request: HttpRequest) -> None:
    limit = max_body_bytes()
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "Content-Length is not a number") from None
    if declared > limit:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit}")
    if len(request.body) > limit:
        raise ApiError(413, f"the request body exceeds the limit of {limit} bytes")


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <token>``; the token's scopes are checked by each endpoint."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        check_body_size(request)
        return ApiToken.authenticate(token.strip())


def require_scope(request: HttpRequest, scope: str) -> ApiToken:
    token: ApiToken = request.auth  # type: ignore[attr-defined]
    if not token.has_scope(scope):
        raise ApiError(403, f"this token lacks the scope {scope!r} (it has: {', '.join(token.scopes) or 'none'})")
    return token


def sign(secret: str, timestamp: str | int, body: bytes) -> str:
    """The signature a sender puts in X-Durable-Signature (tests and client libraries use it)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_webhook(request: HttpRequest, endpoint_name: str, now: float | None = None) -> tuple[WebhookEndpoint, str]:
    """Check the endpoint, timestamp window and signature; returns (endpoint, delivery id)."""
    check_body_size(request)
    endpoint = WebhookEndpoint.objects.filter(name=endpoint_name, active=True).first()
    signature = request.headers.get(SIGNATURE_HEADER, "")
    timestamp = request.headers.get(TIMESTAMP_HEADER, "")
    if endpoint is None:
        # Same answer as a bad signature: do not tell strangers which endpoints exist.
        raise ApiError(401, "unknown webhook endpoint or bad signature")
    if not signature or not timestamp:
        raise ApiError(401, f"a webhook delivery needs the {SIGNATURE_HEADER} and {TIMESTAMP_HEADER} headers")
    try:
        sent = int(timestamp)
    except ValueError:
        raise ApiError(401, f"{TIMESTAMP_HEADER} must be unix seconds") from None
    now = time.time() if now is None else now
    if abs(now - sent) > TOLERANCE_SECONDS:
        raise ApiError(401, f"the delivery's timestamp is outside the {TOLERANCE_SECONDS // 60}-minute window")
    expected = sign(endpoint.secret, timestamp, request.body)
    if not hmac.compare_digest(expected, signature.strip()):
        raise ApiError(401, "unknown webhook endpoint or bad signature")
    delivery_id = request.headers.get(DELIVERY_HEADER, "").strip()[:200] or signature.strip()[:200]
    return endpoint, delivery_id
