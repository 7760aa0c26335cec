"""API tokens and webhook endpoints for the HTTP API (runs.api).

Tokens are for machines that call us: the secret is shown once and only its SHA-256 is kept,
so a database leak does not hand out working credentials. Lookup is by that hash (a unique
index), so checking a token costs one indexed query and no timing-sensitive comparison.

Webhook endpoints are for outside systems we do not give tokens to: they sign each delivery
with HMAC-SHA256 over ``timestamp.body``. Verifying needs the shared secret itself, so it is
stored as is (as Stripe and GitHub do); a delivery is remembered so a replay is refused.
"""

from __future__ import annotations

import hashlib
import secrets

from django.db import models
from django.utils import timezone

__all__ = ["API_SCOPES", "ApiToken", "WebhookDelivery", "WebhookEndpoint", "hash_secret"]

# runs:read     list and search runs, read one, its journal page by page, its state at a step, approvals
# runs:start    start a run
# runs:act      cancel, pause, unpause, retry, resume, compensate (the dashboard's operator actions)
# runs:fork     time travel: fork or re-run from a step, replay-check against the current code
# effects:resolve  decide an in-doubt effect (done with a result, retry under its key, skip)
# signals:send  send a signal;  approvals:decide  approve or reject
API_SCOPES = ("runs:start", "runs:read", "runs:act", "runs:fork", "effects:resolve", "signals:send",
              "approvals:decide")
TOKEN_PREFIX = "dui_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiToken(models.Model):
    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=16)  # first characters of the secret, to recognise it in lists
    secret_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)  # subset of API_SCOPES
    roles = models.JSONField(default=list)  # roles it holds when deciding approvals (e.g. ["operator"])
    actor = models.CharField(max_length=150)  # recorded as the actor of every action taken with it
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str, scopes: list[str] | tuple[str, ...], *, actor: str = "",
              roles: list[str] | tuple[str, ...] = ()) -> tuple[ApiToken, str]:
        """Create a token; returns it and the secret, which is never stored or shown again."""
        unknown = sorted(set(scopes) - set(API_SCOPES))
        if unknown:
            raise ValueError(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(API_SCOPES)}")
        if not name or len(name) > 100:
            raise ValueError("a token needs a name of 1 to 100 characters")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(name=name, prefix=secret[:12], secret_hash=hash_secret(secret),
                                   scopes=sorted(set(scopes)), roles=sorted(set(roles)),
                                   actor=actor or f"token:{name}")
        return token, secret

    @classmethod
    def authenticate(cls, secret: str) -> ApiToken | None:
        if not secret or len(secret) > 200:
            return None
        return cls.objects.filter(secret_hash=hash_secret(secret), revoked_at__isnull=True).first()

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or [])


class WebhookEndpoint(models.Model):
    name = models.SlugField(max_length=100, unique=True)  # the <endpoint> in /api/webhooks/<endpoint>/signal
    secret = models.CharField(max_length=200)  # shared with the sender; needed in clear to verify HMACs
    actor = models.CharField(max_length=150)  # recorded as the sender of its signals
    signals = models.JSONField(default=list)  # signal names it may send; empty: any the agent declares
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def create_with_secret(cls, name: str, *, actor: str = "", signals: list[str] | tuple[str, ...] = ()
                           ) -> tuple[WebhookEndpoint, str]:
        secret = "whsec_" + secrets.token_urlsafe(32)
        endpoint = cls.objects.create(name=name, secret=secret, actor=actor or f"webhook:{name}",
                                      signals=sorted(set(signals)))
        return endpoint, secret


class WebhookDelivery(models.Model):
    """A delivery we accepted: a second one with the same id (or signature) is a replay."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.CharField(max_length=200)  # the sender's delivery id, else the signature
    received_at = models.DateTimeField(default=timezone.now)
    run_id = models.UUIDField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "delivery_id"], name="webhook_delivery_once")]
        indexes = [models.Index(fields=["received_at"], name="webhook_delivery_age")]

    def __str__(self) -> str:
        return f"{self.endpoint_id}:{self.delivery_id}"
