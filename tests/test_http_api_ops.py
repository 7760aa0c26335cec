"""The HTTP API's operator and engineer endpoints: what the dashboard does, through bearer tokens.

For each: the happy path on a run driven by the real engine, 403 without its scope (nothing recorded),
404 for an unknown run, 409 (code "conflict") for a run in a state that does not allow it; every action
audited with the token's actor exactly as the dashboard audits its own.
"""

import json
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

import journal
from journal.models import EffectStatus, EventKind, Run, RunStatus, SessionEvent, SideEffect
from runs.models import API_SCOPES, ApiToken, AuditEntry
from tests.agents import dashboard_demo, waiting  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)
UNKNOWN = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
def client():
    return Client()


@pytest.fixture
def robot():
    return ApiToken.issue("robot", list(API_SCOPES))[1]


def call(client, method, path, body=None, secret=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
    fn = getattr(client, method)
    if body is None and method == "get":
        return fn(path, **headers)
    if body is None:  # a POST without a body, as curl -X POST sends it
        return fn(path, data="", content_type="application/json", **headers)
    return fn(path, data=json.dumps(body), content_type="application/json", **headers)


def recorded() -> tuple:
    """Everything a refusal before the engine must leave untouched."""
    return Run.objects.count(), SessionEvent.objects.count(), AuditEntry.objects.count(), \
        list(Run.objects.order_by("id").values_list("status", "paused"))


def operator_actions(run_id) -> list[tuple]:
    return [(e.payload.get("action"), e.actor, e.payload.get("reason"))
            for e in SessionEvent.objects.filter(run_id=run_id, kind=EventKind.OPERATOR_ACTION).order_by("seq")]


def suspended(drive) -> str:
    run_id = journal.start("wait-signal")
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    return str(run_id)


def completed(drive, name="report.txt") -> str:
    run_id = journal.start("dash_ok", name)
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    return str(run_id)


def failed(drive) -> str:
    run_id = journal.start("dash_fail", "broken.txt")
    drive()
    assert journal.get_run(run_id).status == RunStatus.FAILED
    return str(run_id)


def in_doubt(drive) -> str:
    """dash_checkout charged the card (effect at step 1) and waits; then, as after a crash between executing the
    effect and recording it, the ledger says started and the run needs attention."""
    run_id = journal.start("dash_checkout", 30)
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    SideEffect.objects.filter(run_id=run_id, position=1).update(status=EffectStatus.STARTED, result=None,
                                                                completed_at=None)
    Run.objects.filter(id=run_id).update(status=RunStatus.NEEDS_ATTENTION, waiting_for=None,
                                         attention_reason="the effect at step 1 is in doubt")
    return str(run_id)


# -- GET /runs ----------------------------------------------------------------------------------------------

def test_list_filters_like_the_runs_page_and_pages_by_cursor(client, robot, drive):
    ok = [completed(drive, f"doc-{i}.txt") for i in range(3)]
    bad = failed(drive)
    waiting_run = suspended(drive)
    body = call(client, "get", "/api/runs", secret=robot).json()
    assert {r["run_id"] for r in body["runs"]} == {*ok, bad, waiting_run} and body["next"] is None
    assert [r["run_id"] for r in call(client, "get", "/api/runs?status=failed", secret=robot).json()["runs"]] == [bad]
    both = call(client, "get", "/api/runs?status=failed&status=suspended", secret=robot).json()["runs"]
    assert {r["run_id"] for r in both} == {bad, waiting_run}
    assert {r["run_id"] for r in call(client, "get", "/api/runs?agent=dash_ok", secret=robot).json()["runs"]} == set(ok)
    # text search in the input, output and error, and a run id
    assert [r["run_id"] for r in call(client, "get", "/api/runs?q=doc-1", secret=robot).json()["runs"]] == [ok[1]]
    assert [r["run_id"] for r in call(client, "get", "/api/runs?q=unexpected+token",
                                      secret=robot).json()["runs"]] == [bad]
    assert [r["run_id"] for r in call(client, "get", f"/api/runs?q={ok[2]}", secret=robot).json()["runs"]] == [ok[2]]
    assert call(client, "get", "/api/runs?since=2999-01-01", secret=robot).json()["runs"] == []
    assert len(call(client, "get", "/api/runs?until=2999-01-01", secret=robot).json()["runs"]) == 5
    # keyset pages of 2, oldest first: every run once, in order, then no next
    seen, cursor = [], ""
    for _ in range(5):
        page = call(client, "get", f"/api/runs?sort=created&limit=2&cursor={cursor}", secret=robot).json()
        seen += [r["run_id"] for r in page["runs"]]
        if not page["next"]:
            break
        cursor = page["next"]
    assert seen == [*ok, bad, waiting_run]
    row = call(client, "get", f"/api/runs?q={bad}", secret=robot).json()["runs"][0]
    assert row["status"] == "failed" and "unexpected token" in row["error"] and row["steps"] == 3


def test_list_refuses_bad_filters_in_the_documented_shape(client, robot):
    for query, status in [("status=nope", 422), ("limit=0", 422), ("limit=201", 422), ("sort=input", 422),
                          ("since=yesterday", 400), ("cursor=%21%21garbage", 400), ("q=a%00b", 400)]:
        resp = call(client, "get", f"/api/runs?{query}", secret=robot)
        assert resp.status_code == status, (query, resp.content)
        assert set(resp.json()) == {"detail", "code"}


# -- GET /runs/{id}/events and /steps/{n} -----------------------------------------------------------------

def test_events_page_by_page(client, robot, drive):
    run_id = completed(drive)
    all_seqs = list(SessionEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert len(all_seqs) > 4
    seen, after = [], 0
    while True:
        page = call(client, "get", f"/api/runs/{run_id}/events?after={after}&limit=3", secret=robot).json()
        assert len(page["events"]) <= 3
        seen += [e["seq"] for e in page["events"]]
        if page["next"] is None:
            break
        after = page["next"]
    assert seen == all_seqs
    first = call(client, "get", f"/api/runs/{run_id}/events?limit=1", secret=robot).json()["events"][0]
    assert first["kind"] == EventKind.RUN_STARTED and first["payload"]["input"]
    assert call(client, "get", f"/api/runs/{run_id}/events?after={all_seqs[-1]}",
                secret=robot).json() == {"run_id": run_id, "events": [], "next": None}


def test_state_at_a_step(client, robot, drive):
    run_id = completed(drive)
    resp = call(client, "get", f"/api/runs/{run_id}/steps/1", secret=robot)
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["position"] == 1 and body["total"] == journal.state_at(run_id, 1).total
    assert body["record"]["step_name"].endswith("fetch_doc") and body["result"] == {"name": "report.txt",
                                                                                    "words": 100}
    assert body["diff"]["result"] == body["result"]
    last = call(client, "get", f"/api/runs/{run_id}/steps/{body['total']}", secret=robot).json()
    assert last["position"] == body["total"]
    beyond = call(client, "get", f"/api/runs/{run_id}/steps/{body['total'] + 1}", secret=robot)
    assert beyond.status_code == 404 and "out of range" in beyond.json()["detail"]
    assert call(client, "get", f"/api/runs/{run_id}/steps/0", secret=robot).status_code == 422


# -- actions: happy paths -------------------------------------------------------------------------------------

def test_cancel_records_the_token_in_the_journal_and_the_audit_log(client, robot, drive):
    run_id = suspended(drive)
    resp = call(client, "post", f"/api/runs/{run_id}/cancel", {"reason": "not needed"}, robot)
    assert resp.status_code == 202, resp.content
    assert resp.json()["status"] == "cancelled" and journal.get_run(run_id).cancelled_by == "token:robot"
    event = SessionEvent.objects.get(run_id=run_id, kind=EventKind.RUN_CANCELLED)
    assert event.actor == "token:robot" and event.payload["reason"] == "not needed"
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, str(entry.run_id), entry.ok, entry.comment) == \
        ("token:robot", "cancel", run_id, True, "not needed")


def test_pause_then_unpause(client, robot, drive):
    run_id = suspended(drive)
    resp = call(client, "post", f"/api/runs/{run_id}/pause", {"reason": "incident"}, robot)
    assert resp.status_code == 202 and resp.json()["paused"] is True
    resp = call(client, "post", f"/api/runs/{run_id}/unpause", secret=robot)  # the body is optional
    assert resp.status_code == 200 and resp.json()["paused"] is False
    assert operator_actions(run_id) == [("pause", "token:robot", "incident"), ("unpause", "token:robot", "")]
    assert list(AuditEntry.objects.order_by("id").values_list("action", "actor", "ok")) == [
        ("pause", "token:robot", True), ("unpause", "token:robot", True)]


def test_retry_a_failed_run(client, robot, drive):
    run_id = failed(drive)
    resp = call(client, "post", f"/api/runs/{run_id}/retry", {"reason": "try again"}, robot)
    assert resp.status_code == 202 and resp.json()["status"] == "pending" and resp.json()["error"] == ""
    assert operator_actions(run_id) == [("retry", "token:robot", "try again")]
    drive()
    assert journal.get_run(run_id).status == RunStatus.FAILED  # the same bug fails it again, honestly


def test_resume_a_needs_attention_run(client, robot, drive):
    run_id = suspended(drive)
    Run.objects.filter(id=run_id).update(status=RunStatus.NEEDS_ATTENTION, attention_reason="code changed")
    resp = call(client, "post", f"/api/runs/{run_id}/resume", {"reason": "compatible deploy"}, robot)
    assert resp.status_code == 202 and resp.json()["status"] == "pending"
    assert operator_actions(run_id) == [("resume", "token:robot", "compatible deploy")]


def test_compensate_a_cancelled_checkout(client, robot, drive):
    run_id = journal.start("dash_checkout", 30)  # charges the card (an effect), then waits
    drive()
    journal.cancel(run_id, "customer left", actor="alice")
    assert journal.get_run(run_id).status == RunStatus.CANCELLED
    resp = call(client, "post", f"/api/runs/{run_id}/compensate", {"reason": "refund"}, robot)
    assert resp.status_code == 202 and resp.json()["status"] == "compensating"
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPENSATED
    effect = SideEffect.objects.get(run_id=run_id, position=1)
    assert effect.status == EffectStatus.COMPENSATED and effect.compensation_result == {"refunded": 30}
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.ok, entry.comment) == ("compensate", "token:robot", True, "refund")


def test_fork_re_runs_from_a_step_or_with_an_edited_result(client, robot, drive):
    run_id = completed(drive)
    resp = call(client, "post", f"/api/runs/{run_id}/fork", {"at_step": 2, "reason": "again"}, robot)
    assert resp.status_code == 201, resp.content
    child = resp.json()
    assert child["forked_from"] == run_id and child["fork_step"] == 2 and child["run_id"] != run_id
    edited = call(client, "post", f"/api/runs/{run_id}/fork",
                  {"at_step": 1, "override": {"name": "edited.txt", "words": 5}}, robot)
    assert edited.status_code == 201, edited.content
    drive()
    assert journal.get_run(child["run_id"]).output == {"summary": "summary of report.txt"}
    assert journal.get_run(edited.json()["run_id"]).output == {"summary": "summary of edited.txt"}
    assert Run.objects.get(id=child["run_id"]).created_by == "token:robot"
    assert list(AuditEntry.objects.order_by("id").values_list("action", "ok")) == [("fork", True), ("fork", True)]
    beyond = call(client, "post", f"/api/runs/{run_id}/fork", {"at_step": 999}, robot)
    assert beyond.status_code == 400 and "recorded step" in beyond.json()["detail"]


def test_replay_check(client, robot, drive):
    run_id = completed(drive)
    resp = call(client, "post", f"/api/runs/{run_id}/replay-check", secret=robot)
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["ok"] is True and body["divergence"] is None and body["checked"] == body["recorded"] > 0
    assert body["outcome"] == "returned" and body["run_id"] == run_id
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.ok) == ("replay_check", "token:robot", True)
    assert "passed" in entry.result


@pytest.mark.parametrize("action", ["done", "skip", "retry"])
def test_resolve_an_in_doubt_effect(client, robot, drive, action):
    run_id = in_doubt(drive)
    body = {"action": action, "comment": "checked the processor"}
    if action == "done":
        body["result"] = {"charged": 30}
    resp = call(client, "post", f"/api/runs/{run_id}/effects/1/resolve", body, robot)
    assert resp.status_code == 202, resp.content
    assert resp.json()["status"] == "pending"
    effect = SideEffect.objects.get(run_id=run_id, position=1)
    assert effect.resolved_by == "token:robot"
    assert effect.status == {"done": EffectStatus.COMPLETED, "skip": EffectStatus.SKIPPED,
                             "retry": EffectStatus.STARTED}[action]
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.ok) == ("resolve_effect", "token:robot", True)
    again = call(client, "post", f"/api/runs/{run_id}/effects/1/resolve", body, robot)
    assert again.status_code == 409 and again.json()["code"] == "conflict"


def test_resolve_refuses_a_result_without_done(client, robot, drive):
    run_id = in_doubt(drive)
    before = recorded()
    resp = call(client, "post", f"/api/runs/{run_id}/effects/1/resolve", {"action": "skip", "result": 1}, robot)
    assert resp.status_code == 400 and recorded() == before
    resp = call(client, "post", f"/api/runs/{run_id}/effects/1/resolve", {"action": "maybe"}, robot)
    assert resp.status_code == 422 and recorded() == before


# -- every endpoint: 403, 404, 409 --------------------------------------------------------------------------

ENDPOINTS = {  # name: (method, path under /api/runs/{id}, body, scope)
    "list": ("get", None, None, "runs:read"),
    "events": ("get", "/events", None, "runs:read"),
    "step": ("get", "/steps/1", None, "runs:read"),
    "cancel": ("post", "/cancel", {"reason": "r"}, "runs:act"),
    "pause": ("post", "/pause", {}, "runs:act"),
    "unpause": ("post", "/unpause", {}, "runs:act"),
    "retry": ("post", "/retry", {}, "runs:act"),
    "resume": ("post", "/resume", {}, "runs:act"),
    "compensate": ("post", "/compensate", {}, "runs:act"),
    "fork": ("post", "/fork", {"at_step": 1}, "runs:fork"),
    "replay-check": ("post", "/replay-check", None, "runs:fork"),
    "resolve": ("post", "/effects/1/resolve", {"action": "skip"}, "effects:resolve"),
}


def url(name: str, run_id: str) -> str:
    suffix = ENDPOINTS[name][1]
    return "/api/runs" if suffix is None else f"/api/runs/{run_id}{suffix}"


@pytest.mark.parametrize("name", list(ENDPOINTS))
def test_wrong_scope_is_403_and_records_nothing(client, drive, name):
    method, _, body, scope = ENDPOINTS[name]
    others = ApiToken.issue("others", [s for s in API_SCOPES if s != scope])[1]
    run_id = in_doubt(drive) if name in ("resolve", "resume") else failed(drive)
    before = recorded()
    resp = call(client, method, url(name, run_id), body, others)
    assert resp.status_code == 403, resp.content
    assert resp.json()["code"] == "forbidden" and scope in resp.json()["detail"]
    assert recorded() == before
    assert call(client, method, url(name, run_id), body).status_code == 401


@pytest.mark.parametrize("name", [n for n in ENDPOINTS if n != "list"])
def test_unknown_run_is_404_and_records_nothing(client, robot, name):
    method, _, body, _scope = ENDPOINTS[name]
    before = recorded()
    resp = call(client, method, url(name, UNKNOWN), body, robot)
    assert resp.status_code == 404, resp.content
    assert resp.json()["code"] == "not_found" and recorded() == before
    assert call(client, method, url(name, "not-a-run-id"), body, robot).status_code == 422


# A run in each endpoint's wrong state: "completed" (finished), "fresh" (started, no steps recorded yet).
WRONG_STATE = {"cancel": "completed", "pause": "completed", "unpause": "completed", "retry": "completed",
               "resume": "completed", "compensate": "completed", "resolve": "completed", "fork": "fresh",
               "replay-check": "fresh", "step": "fresh"}


@pytest.mark.parametrize("name", list(WRONG_STATE))
def test_a_run_in_the_wrong_state_is_409_conflict(client, robot, drive, name):
    method, _, body, _scope = ENDPOINTS[name]
    run_id = completed(drive) if WRONG_STATE[name] == "completed" else str(journal.start("dash_ok", "later.txt"))
    status = journal.get_run(run_id).status
    events = SessionEvent.objects.filter(run_id=run_id).count()
    resp = call(client, method, url(name, run_id), body, robot)
    assert resp.status_code == 409, resp.content
    assert resp.json()["code"] == "conflict" and isinstance(resp.json()["detail"], str)
    assert journal.get_run(run_id).status == status and SessionEvent.objects.filter(run_id=run_id).count() == events
    if method == "post":  # a refused action is audited as refused, as the dashboard audits it
        entry = AuditEntry.objects.get()
        assert entry.ok is False and entry.actor == "token:robot" and entry.result == resp.json()["detail"]


def test_apitoken_command_knows_the_new_scopes(client):
    out = StringIO()
    call_command("apitoken", "create", "ops", "--scopes", "runs:read,runs:act,runs:fork,effects:resolve", stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    assert call(client, "get", f"/api/runs/{uuid.uuid4()}/events", secret=secret).status_code == 404
    with pytest.raises(Exception, match="unknown scope"):
        call_command("apitoken", "create", "bad", "--scopes", "runs:everything", stdout=StringIO())


def test_every_new_operation_is_in_the_schema_with_its_statuses(client):
    schema = client.get("/api/openapi.json").json()
    paths = schema["paths"]
    for name, (method, suffix, _body, _scope) in ENDPOINTS.items():
        path = "/api/runs" if suffix is None else "/api/runs/{run_id}" + suffix.replace("/1", "/{n}" if
                                                                                      name == "step" else
                                                                                      "/{position}")
        documented = set(paths[path][method]["responses"])
        assert {"400", "401", "403", "404", "409", "422"} <= documented, (name, documented)
        assert documented & {"200", "201", "202"}, (name, documented)


def test_the_navigation_links_the_api_docs(client, personas):
    client.force_login(personas["viewer"])
    page = client.get("/")
    assert page.status_code == 200 and b'<a href="/api/docs">API docs</a>' in page.content
    assert client.get("/api/docs").status_code == 200


def test_a_page_of_runs_costs_the_same_few_queries_however_many_rows(client, robot, django_assert_max_num_queries):
    for i in range(40):
        journal.start("dash_ok", f"doc-{i}.txt")
    with django_assert_max_num_queries(3):  # the token, the page; never one per row
        body = call(client, "get", "/api/runs?limit=30&status=pending", secret=robot).json()
    assert len(body["runs"]) == 30 and body["next"]
