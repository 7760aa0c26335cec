"""The HTTP API: token scopes, HMAC-signed webhooks, JSON errors with the right codes, nothing recorded on refusal."""

import json
import re
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

import journal
from journal.models import ApprovalDecision, Run, RunStatus, SessionEvent, Signal
from runs.api.auth import sign
from runs.models import ApiToken, WebhookDelivery, WebhookEndpoint
from tests.agents import waiting  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)
ALL = ["runs:start", "runs:read", "signals:send", "approvals:decide"]



@pytest.fixture
def client():
    return Client()


def token(scopes=ALL, name="robot", roles=("operator",)) -> str:
    return ApiToken.issue(name, scopes, roles=roles)[1]


def call(client, method, path, body=None, secret=None, raw=None, **headers):
    if secret:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    fn = getattr(client, method)
    if data is None:
        return fn(path, **headers)
    return fn(path, data=data, content_type="application/json", **headers)


def snapshot() -> tuple:
    """Everything a refusal must leave untouched."""
    return (Run.objects.count(), SessionEvent.objects.count(), Signal.objects.count(),
            ApprovalDecision.objects.count(), WebhookDelivery.objects.count())


def test_start_read_signal_through_the_api_records_the_token_actor(client, drive):
    secret = token()
    resp = call(client, "post", "/api/runs", {"agent": "wait-signal"}, secret)
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["run_id"]
    assert Run.objects.get(id=run_id).created_by == "token:robot"
    drive()
    resp = call(client, "get", f"/api/runs/{run_id}", secret=secret)
    assert resp.json()["status"] == "suspended" and resp.json()["waiting_for"]["name"] == "go"
    resp = call(client, "post", f"/api/runs/{run_id}/signals", {"name": "go", "payload": {"x": 1},
                                                                 "signal_id": "s-1"}, secret)
    assert resp.status_code == 202, resp.content
    again = call(client, "post", f"/api/runs/{run_id}/signals", {"name": "go", "payload": {"x": 1},
                                                                  "signal_id": "s-1"}, secret)
    assert again.status_code == 202 and Signal.objects.count() == 1  # idempotent under signal_id
    drive()
    body = call(client, "get", f"/api/runs/{run_id}", secret=secret).json()
    assert body["status"] == "completed" and body["output"] == {"payload": {"x": 1}}
    assert Signal.objects.get().actor == "token:robot"


def test_openapi_schema_and_docs_are_published(client):
    schema = client.get("/api/openapi.json").json()
    assert {"/api/runs", "/api/runs/{run_id}/signals", "/api/approvals/{approval_id}/decision",
            "/api/webhooks/{endpoint}/signal"} <= set(schema["paths"])
    docs = client.get("/api/docs")
    assert docs.status_code == 200 and b"cdn." not in docs.content  # Swagger UI from our static files
    assets = re.findall(r'(?:src|href)="(/static/ninja/[^"]+)"', docs.content.decode())
    assert {"/static/ninja/swagger-ui-bundle.js", "/static/ninja/swagger-ui.css"} <= set(assets)
    for asset in assets:  # served by this server (ninja is not an installed app: runs/api/docs.py)
        served = client.get(asset)
        served.close()  # a file response holds its file open until closed
        assert served.status_code == 200, asset


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_missing_or_wrong_tokens_get_401_and_change_nothing(client, header):
    token()
    before = snapshot()
    headers = {"HTTP_AUTHORIZATION": header} if header else {}
    resp = client.post("/api/runs", data=json.dumps({"agent": "wait-signal"}), content_type="application/json",
                       **headers)
    assert resp.status_code == 401
    assert snapshot() == before


def test_revoked_token_is_refused(client):
    secret = token()
    ApiToken.objects.update(revoked_at="2020-01-01T00:00:00Z")
    assert call(client, "get", "/api/approvals", secret=secret).status_code == 401


def test_wrong_scope_gets_403_and_changes_nothing(client, drive):
    reader = token(["runs:read"], name="reader")
    before = snapshot()
    resp = call(client, "post", "/api/runs", {"agent": "wait-signal"}, reader)
    assert resp.status_code == 403 and "runs:start" in resp.json()["detail"]
    run_id = journal.start("wait-signal")
    drive()
    before = snapshot()
    assert call(client, "post", f"/api/runs/{run_id}/signals", {"name": "go"}, reader).status_code == 403
    assert snapshot() == before


def test_bad_requests_get_the_right_4xx_and_change_nothing(client, drive, settings):
    secret = token()
    settings.DURABLE_API_MAX_BODY_BYTES = 2000
    finished = journal.start("wait-signal", 0.01)
    drive()
    assert journal.get_run(finished).status == RunStatus.COMPLETED
    before = snapshot()
    cases = [
        ("post", "/api/runs", None, "{not json", 400),
        ("post", "/api/runs", {"agent": "no-such-agent"}, None, 404),
        ("post", "/api/runs", {"agent": "wait-signal", "args": [1, 2, 3]}, None, 400),
        ("post", "/api/runs", {"args": "not a list"}, None, 422),
        ("post", "/api/runs", {"agent": "wait-signal", "args": ["x" * 5000]}, None, 413),
        ("get", "/api/runs/00000000-0000-0000-0000-000000000000", None, None, 404),
        ("get", "/api/runs/not-a-uuid", None, None, 422),
        ("post", f"/api/runs/{finished}/signals", {"name": "go"}, None, 409),
        ("post", "/api/approvals/00000000-0000-0000-0000-000000000000/decision", {"approved": True}, None, 404),
        ("post", "/api/approvals/00000000-0000-0000-0000-000000000000/decision", {"approved": "maybe"}, None, 422),
    ]
    for method, path, body, raw, status in cases:
        resp = call(client, method, path, body, secret, raw=raw)
        assert resp.status_code == status, (path, body, raw, resp.status_code, resp.content)
        assert "detail" in resp.json()
    assert snapshot() == before


def test_unknown_signal_name_is_refused_with_400(client, drive):
    secret = token()
    run_id = journal.start("wait-signal")
    drive()
    before = snapshot()
    resp = call(client, "post", f"/api/runs/{run_id}/signals", {"name": "stop"}, secret)
    assert resp.status_code == 400 and "declares: go" in resp.json()["detail"]
    assert snapshot() == before


def test_approvals_listed_and_decided_through_the_api(client, drive):
    secret = token()
    viewer = token(["runs:read"], name="viewer")
    run_id = journal.start("approve-me", prompt="<script>alert(1)</script>", role="finance")
    drive()
    listed = call(client, "get", "/api/approvals", secret=viewer).json()
    assert [a["run_id"] for a in listed] == [run_id]
    approval_id = listed[0]["approval_id"]
    assert listed[0]["prompt"] == "<script>alert(1)</script>"  # JSON, not HTML: returned verbatim
    before = snapshot()
    assert call(client, "post", f"/api/approvals/{approval_id}/decision", {"approved": True},
                viewer).status_code == 403  # scope
    assert call(client, "post", f"/api/approvals/{approval_id}/decision", {"approved": True},
                secret).status_code == 403  # role: the token is an operator, the approval wants finance
    assert snapshot() == before
    finance = token(name="cfo-bot", roles=("finance",))
    resp = call(client, "post", f"/api/approvals/{approval_id}/decision",
                {"approved": True, "comment": "ok", "edited": {"amount": 5}}, finance)
    assert resp.status_code == 200 and resp.json()["status"] == "approved"
    again = call(client, "post", f"/api/approvals/{approval_id}/decision", {"approved": False}, finance)
    assert again.status_code == 409
    drive()
    run = journal.get_run(run_id)
    assert run.output["decided_by"] == ["token:cfo-bot"] and run.output["edited"] == {"amount": 5}


# -- webhooks ------------------------------------------------------------------------------

@pytest.fixture
def hook():
    return WebhookEndpoint.create_with_secret("billing", signals=["go"])


def deliver(client, secret, body, *, endpoint="billing", ts=None, signature=None, delivery=None, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    ts = str(int(time.time())) if ts is None else str(ts)
    headers = {"HTTP_X_DURABLE_TIMESTAMP": ts, "HTTP_X_DURABLE_SIGNATURE": signature or sign(secret, ts, data)}
    if delivery:
        headers["HTTP_X_DURABLE_DELIVERY"] = delivery
    return client.post(f"/api/webhooks/{endpoint}/signal", data=data, content_type="application/json", **headers)


def test_signed_webhook_signals_the_run_once(client, drive, hook):
    _, secret = hook
    run_id = journal.start("wait-signal")
    drive()
    resp = deliver(client, secret, {"run_id": run_id, "name": "go", "payload": {"paid": True}}, delivery="d-1")
    assert resp.status_code == 202, resp.content
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"payload": {"paid": True}}
    assert Signal.objects.get().actor == "webhook:billing"


def test_forged_expired_and_replayed_webhooks_are_refused_and_change_nothing(client, drive, hook):
    _, secret = hook
    run_id = journal.start("wait-signal")
    drive()
    body = {"run_id": run_id, "name": "go", "payload": 1}
    data = json.dumps(body).encode()
    now = int(time.time())
    before = snapshot()
    assert deliver(client, "whsec_wrong", body).status_code == 401  # forged: wrong secret
    assert deliver(client, secret, body, signature=sign(secret, now, b'{"tampered": 1}')).status_code == 401
    # Ten minutes off, not five and a second: a slow machine must not bring the test's clock inside the window.
    assert deliver(client, secret, body, ts=now - 600).status_code == 401  # expired (outside 5 minutes)
    assert deliver(client, secret, body, ts=now + 600).status_code == 401  # from the future
    assert deliver(client, secret, body, endpoint="nope").status_code == 401
    assert deliver(client, secret, body, ts="yesterday").status_code == 401
    assert client.post("/api/webhooks/billing/signal", data=data, content_type="application/json").status_code == 401
    assert deliver(client, secret, None, raw=b"{broken").status_code == 400  # signed but malformed
    assert deliver(client, secret, {"name": "go"}).status_code == 422  # signed but no run_id
    assert deliver(client, secret, {"run_id": run_id, "name": "other"}).status_code == 403  # not allowed
    assert deliver(client, secret, {"run_id": "00000000-0000-0000-0000-000000000000",
                                    "name": "go"}).status_code == 404
    assert snapshot() == before

    ts = str(now)
    signature = sign(secret, ts, data)
    first = deliver(client, secret, body, ts=ts, signature=signature)
    assert first.status_code == 202
    after_first = snapshot()
    replay = deliver(client, secret, body, ts=ts, signature=signature)
    assert replay.status_code == 409 and replay.json()["code"] == "replayed"
    assert snapshot() == after_first


def test_oversized_webhook_gets_413(client, hook, settings):
    _, secret = hook
    settings.DURABLE_API_MAX_BODY_BYTES = 1024
    before = snapshot()
    resp = deliver(client, secret, {"run_id": "x", "name": "go", "payload": "y" * 5000})
    assert resp.status_code == 413
    assert snapshot() == before


def test_webhook_to_a_finished_run_is_409_and_the_delivery_is_not_burned(client, drive, hook):
    _, secret = hook
    run_id = journal.start("wait-signal", 0.01)
    drive()
    before = snapshot()
    assert deliver(client, secret, {"run_id": run_id, "name": "go"}, delivery="d-9").status_code == 409
    assert snapshot() == before


def test_apitoken_command_prints_the_secret_once_and_it_works(client):
    out = StringIO()
    call_command("apitoken", "create", "ci", "--scopes", "runs:read,runs:start", stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    assert secret.startswith("dui_") and ApiToken.objects.get(name="ci").secret_hash != secret
    assert call(client, "get", "/api/approvals", secret=secret).status_code == 200
    out = StringIO()
    call_command("apitoken", "list", stdout=out)
    assert "ci" in out.getvalue() and secret not in out.getvalue()
    call_command("apitoken", "revoke", "ci", stdout=StringIO())
    assert call(client, "get", "/api/approvals", secret=secret).status_code == 401


def test_old_deliveries_are_forgotten_once_outside_the_window(client, drive, hook):
    from datetime import timedelta

    from django.utils import timezone

    endpoint, secret = hook
    old = WebhookDelivery.objects.create(endpoint=endpoint, delivery_id="ancient")
    WebhookDelivery.objects.filter(id=old.id).update(received_at=timezone.now() - timedelta(hours=1))
    run_id = journal.start("wait-signal")
    drive()
    assert deliver(client, secret, {"run_id": run_id, "name": "go"}, delivery="fresh").status_code == 202
    assert list(WebhookDelivery.objects.values_list("delivery_id", flat=True)) == ["fresh"]
