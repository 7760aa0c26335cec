"""schemathesis against the API's own OpenAPI schema, in-process over WSGI: no server errors, no status
code the schema does not declare, every body in its declared shape ({"detail", "code"} for errors).

Each operation is exercised with data that fits the schema (positive) and data that does not
(negative), with a bearer token holding every scope; a few ids are real so requests get past
"not found" into the engine: runs driven by a real worker to completed, suspended, failed and
(an effect in doubt) needs_attention, so the operator actions meet both states that allow them and
states that do not (409). The test commits (transaction=True) so that worker can see its runs.
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
import tests.agents.waiting  # noqa: F401  (wait-signal)
from runs.models import API_SCOPES, ApiToken, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = 120  # per operation and mode: 18 operations x 2 modes
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
    _token, secret = ApiToken.issue("schemathesis", list(API_SCOPES), roles=["operator"])
    return secret


@pytest.fixture
def real(db, drive):
    """Ids that exist, so a share of the requests reach the engine instead of stopping at 404: for each
    operator action a run of its own in a state that allows it (once acted on, it is in one that refuses
    it: 409), besides a finished run and one with no steps yet."""
    import journal
    from journal.models import Approval, EffectStatus, Run, RunStatus, SideEffect

    done = journal.start("dash_ok", "report.txt")
    to_cancel, to_pause, to_unpause, to_resume = (journal.start("wait-signal") for _ in range(4))
    failed = journal.start("dash_fail", "broken.txt")
    charged, doubt = journal.start("dash_checkout", 30), journal.start("dash_checkout", 40)
    drive()
    journal.pause(to_unpause, actor="setup")
    journal.cancel(charged, "to be compensated", actor="setup")
    Run.objects.filter(id=to_resume).update(status=RunStatus.NEEDS_ATTENTION, waiting_for=None)
    # As after a crash between executing the charge and recording it: the effect is in doubt.
    SideEffect.objects.filter(run_id=doubt, position=1).update(status=EffectStatus.STARTED, result=None)
    Run.objects.filter(id=doubt).update(status=RunStatus.NEEDS_ATTENTION, waiting_for=None)
    pending = journal.start("dash_ok", "later.txt")  # no steps yet
    waiting = Run.objects.create(agent="dash_review", version="1", status=RunStatus.SUSPENDED,
                                 waiting_for={"kind": "approval", "position": 1})
    approval = Approval.objects.create(run=waiting, position=1, prompt="Publish?", role="operator")
    WebhookEndpoint.objects.create(name="hook", secret="s3cret", actor="hook")
    common = [str(done), str(pending)]
    own = {"cancel": to_cancel, "pause": to_pause, "unpause": to_unpause, "resume": to_resume, "retry": failed,
           "compensate": charged, "effects/{position}/resolve": doubt, "signals": to_cancel}
    ids = {f"/api/runs/{{run_id}}/{action}": [str(run_id), *common] for action, run_id in own.items()}
    return {"run_id": common, "approval_id": [str(approval.id)], "endpoint": ["hook"], "n": [1, 2],
            "position": [1], "by_path": ids}


def _operations(app):
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
    found = []
    for result in schema.get_all_operations():
        found.append(result.ok())
    return found


def _cases(operation, mode: GenerationMode, real: dict):
    """The schema's own cases, and the same with each real id the operation's path takes."""
    ids = {**real, "run_id": real["by_path"].get(operation.path, real["run_id"])}
    names = [p.name for p in operation.path_parameters if p.name in ids]
    base = operation.as_strategy(generation_mode=mode)
    if not names:
        return base
    variants = max(len(ids[name]) for name in names)
    fixed = [{name: ids[name][i % len(ids[name])] for name in names} for i in range(variants)]
    return st.one_of(base, *(operation.as_strategy(generation_mode=mode, path_parameters=f) for f in fixed))


def _with_real_agent(case, real_agent: bool):
    """POST /runs with an agent that exists, POST .../fork at a step that exists: schemathesis' random
    names all stop at 404, its random steps at 400."""
    if real_agent and isinstance(case.body, dict) and "agent" in case.body:
        case.body["agent"] = "dash_ok"
    if real_agent and isinstance(case.body, dict) and isinstance(case.body.get("at_step"), int):
        case.body["at_step"] = 1 + case.body["at_step"] % 2
    return case


def test_schemathesis_finds_no_server_error_and_no_undocumented_response(in_process, token, real):
    operations = _operations(in_process)
    assert len(operations) >= 18, [op.label for op in operations]
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
    # every operation but the webhook (its signature cannot be guessed) succeeded at least once
    assert len(reached) >= len(operations) - 1, f"too few operations ever succeeded: {sorted(reached)}"
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())


def test_unstorable_input_is_400_and_schema_mismatches_422_in_the_documented_shape(client, token, real):
    """On both databases: NUL, a lone surrogate (as JSON escapes) or NaN in a payload is refused with 400
    before the engine is called, and ninja's own validation errors come in {"detail": str, "code": str} too."""
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    url = f"/api/runs/{real['run_id'][0]}/signals"
    unstorable = ['{"name": "go\\u0000"}', '{"name": "go", "payload": {"t": "\\ud800"}}',
                  '{"name": "go", "payload": NaN}', '{"name": "go", "payload": ' + "[" * 150 + "]" * 150 + "}"]
    mismatched = ['{"payload": 1}', '{"name": 5}']
    cases = [*((b, 400, "bad_request") for b in unstorable), *((b, 422, "invalid") for b in mismatched)]
    for body, status, code in cases:
        response = client.post(url, data=body, content_type="application/json", **auth)
        assert response.status_code == status, (body, response.content[:300])
        answer = response.json()
        assert set(answer) == {"detail", "code"} and isinstance(answer["detail"], str), answer
        assert answer["code"] == code, (body, answer)
    from journal.models import Signal

    assert not Signal.objects.filter(run_id=real["run_id"][0]).exists(), "nothing reached the engine"
    response = client.get("/api/approvals?limit=%C2%B2", **auth)
    assert response.status_code == 422 and isinstance(response.json()["detail"], str)
    response = client.get(f"/api/runs/{real['run_id'][0]}")
    assert response.status_code == 401 and response.json() == {"detail": "Unauthorized", "code": "unauthorized"}


def test_every_operation_documents_the_errors_it_can_answer(client):
    schema = client.get("/api/openapi.json").json()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            documented = set(operation["responses"])
            assert {"400", "401", "404", "413", "422"} <= documented, (method, path, documented)
