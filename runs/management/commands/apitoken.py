"""manage.py apitoken: issue, list and revoke API tokens and webhook endpoints (secrets are printed once)."""

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError
from django.utils import timezone

from runs.models import API_SCOPES, ApiToken, WebhookEndpoint


def _csv(value: str) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class Command(BaseCommand):
    help = "Manage HTTP API tokens and webhook endpoints. Secrets are shown once, when created."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a bearer token")
        create.add_argument("name")
        create.add_argument("--scopes", required=True, help=f"comma-separated: {', '.join(API_SCOPES)}")
        create.add_argument("--roles", default="operator", help="roles for deciding approvals (comma-separated)")
        create.add_argument("--actor", default="", help="actor recorded on its actions (default token:<name>)")
        revoke = sub.add_parser("revoke", help="revoke a token")
        revoke.add_argument("name")
        sub.add_parser("list", help="list tokens and webhook endpoints (never their secrets)")
        hook = sub.add_parser("webhook", help="create a webhook endpoint and print its signing secret")
        hook.add_argument("name")
        hook.add_argument("--signals", default="", help="signal names it may send (comma-separated; default any)")
        hook.add_argument("--actor", default="")

    def handle(self, *args, action, **opts):
        try:
            if action == "create":
                token, secret = ApiToken.issue(opts["name"], _csv(opts["scopes"]), actor=opts["actor"],
                                               roles=_csv(opts["roles"]))
                self.stdout.write(f"token {token.name} scopes={','.join(token.scopes)} actor={token.actor}")
                self.stdout.write(secret)
            elif action == "revoke":
                if not ApiToken.objects.filter(name=opts["name"], revoked_at__isnull=True).update(
                        revoked_at=timezone.now()):
                    raise CommandError(f"no active token named {opts['name']!r}")
                self.stdout.write(f"revoked {opts['name']}")
            elif action == "list":
                for t in ApiToken.objects.all():
                    state = "revoked" if t.revoked_at else "active"
                    self.stdout.write(f"token {t.name} {t.prefix}… {state} scopes={','.join(t.scopes)}")
                for e in WebhookEndpoint.objects.all():
                    self.stdout.write(f"webhook {e.name} active={e.active} signals={','.join(e.signals) or '*'}")
            elif action == "webhook":
                endpoint, secret = WebhookEndpoint.create_with_secret(opts["name"], actor=opts["actor"],
                                                                      signals=_csv(opts["signals"]))
                self.stdout.write(f"webhook {endpoint.name}: POST /api/webhooks/{endpoint.name}/signal")
                self.stdout.write(secret)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        except IntegrityError:
            raise CommandError(f"the name {opts['name']!r} is taken") from None
