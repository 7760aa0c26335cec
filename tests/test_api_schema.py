"""schemathesis against the API's own OpenAPI schema, in-process over WSGI: no server errors, no status
code the schema does not declare, every body in its declared shape ({"detail", "code"} for errors).

Each operation is exercised with data that fits the schema (positive) and data that does not
(negative), with a bearer token holding every scope; a few ids are real so requests get past
"not found" into the engine.
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks as ss_checks
from schemathesis.generation import GenerationMode

import tests.agents.dashboard_demo  # noqa: F401  (registers dash_ok before the registry snapshot)
from runs.models import ApiToken, WebhookEndpoint

pytestmark = pytest.mark.django_db

EXAMPLES = 250  # per operation and mode: 7 operations x 2 modes, well under a minute in all
CHECKS = [ss_checks.not_a_server_error, ss_checks.status_code_conformance, ss_checks.content_type_conformance,
          ss_checks.response_schema_conformance]


@pytest.fixture
def in_process():
    """Requests go through Django's WSGI handler in this test's transaction: its start- and end-of-request
    hooks would close the connection the test's data lives on (Django's own test client detaches them too)."""
    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    yield get_wsgi_application()
    for signal in (signals.request_started, signals.request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def token(db):
    _token, secret = ApiToken.issue("schemathesis", ["runs:start", "runs:read", "signals:send", "approvals:decide"],
                                    roles=["operator"])
    return secret


@pytest.fixture
def real(db):
    """Ids that exist, so a share of the requests reach the engine instead of stopping at 404."""
    import journal
    from journal.models import Approval, Run, RunStatus

    run_id = journal.start("dash_ok", "report.txt")
    waiting = Run.objects.create(agent="dash_review", version="1", status=RunStatus.SUSPENDED,
                                 waiting_for={"kind": "approval", "position": 1})
    approval = Approval.objects.create(run=waiting, position=1, prompt="Publish?", role="operator")
    WebhookEndpoint.objects.create(name="hook", secret="s3cret", actor="hook")
    return {"run_id": str(run_id), "approval_id": str(approval.id), "endpoint": "hook"}


def _operations(app):
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
    found = []
    for result in schema.get_all_operations():
        found.append(result.ok())
    return found


def _cases(operation, mode: GenerationMode, real: dict):
    """The schema's own cases, and the same with each real id the operation's path takes."""
    names = [p.name for p in operation.path_parameters]
    fixed = {name: real[name] for name in names if name in real}
    base = operation.as_strategy(generation_mode=mode)
    return st.one_of(base, operation.as_strategy(generation_mode=mode, path_parameters=fixed)) if fixed else base


def _with_real_agent(case, real_agent: bool):
    """POST /runs with an agent that exists: schemathesis' random names all stop at 404."""
    if real_agent and isinstance(case.body, dict) and "agent" in case.body:
        case.body["agent"] = "dash_ok"
    return case


def test_schemathesis_finds_no_server_error_and_no_undocumented_response(in_process, token, real):
    operations = _operations(in_process)
    assert len(operations) >= 7, [op.label for op in operations]
    failures: dict[str, str] = {}
    statuses: Counter[str] = Counter()
    sent = 0
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = _cases(operation, mode, real)

            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                      derandomize=True)
            @given(case=strategy, auth=st.sampled_from([True, True, True, False]), real_agent=st.booleans())
            def probe(case, auth, real_agent):
                nonlocal sent
                sent += 1
                headers = {"Authorization": f"Bearer {token}"} if auth else {}
                response = _with_real_agent(case, real_agent).call(headers=headers)
                statuses[f"{case.operation.method.upper()} {case.operation.path} {response.status_code}"] += 1
                case.validate_response(response, checks=CHECKS)

            try:
                probe()
            except (Exception, BaseExceptionGroup) as exc:  # hypothesis re-raises the minimal failing case(s)
                failures[f"{operation.label} [{mode.value}]"] = f"{type(exc).__name__}: {exc!s:.1500}"
    print(f"schemathesis: {len(operations)} operations, {sent} requests:", dict(sorted(statuses.items())))
    reached = {key.rsplit(" ", 1)[0] for key, n in statuses.items() if key.endswith((" 200", " 201", " 202"))}
    assert len(reached) >= 4, f"too few operations ever succeeded: {reached}"
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())


def test_unstorable_input_and_schema_mismatches_are_422_in_the_documented_shape(client, token, real):
    """On both databases: NUL, a lone surrogate (as JSON escapes) or NaN in a payload is refused before the
    engine is called, and ninja's own validation errors come in {"detail": str, "code": str} too."""
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    url = f"/api/runs/{real['run_id']}/signals"
    bodies = ['{"name": "go\\u0000"}', '{"name": "go", "payload": {"t": "\\ud800"}}', '{"name": "go", "payload": NaN}',
              '{"name": "go", "payload": ' + "[" * 150 + "]" * 150 + "}", '{"payload": 1}', '{"name": 5}']
    for body in bodies:
        response = client.post(url, data=body, content_type="application/json", **auth)
        assert response.status_code == 422, (body, response.content[:300])
        answer = response.json()
        assert set(answer) == {"detail", "code"} and isinstance(answer["detail"], str), answer
        assert answer["code"] == "invalid"
    from journal.models import Signal

    assert not Signal.objects.filter(run_id=real["run_id"]).exists(), "nothing reached the engine"
    response = client.get("/api/approvals?limit=%C2%B2", **auth)
    assert response.status_code == 422 and isinstance(response.json()["detail"], str)
    response = client.get(f"/api/runs/{real['run_id']}")
    assert response.status_code == 401 and response.json() == {"detail": "Unauthorized", "code": "unauthorized"}


def test_every_operation_documents_the_errors_it_can_answer(client):
    schema = client.get("/api/openapi.json").json()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            documented = set(operation["responses"])
            assert {"400", "401", "404", "413", "422"} <= documented, (method, path, documented)
