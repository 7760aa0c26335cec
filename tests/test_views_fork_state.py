"""Fork with edited state from the stepper and the HTTP API: the third fork form, sent only when asked."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

import journal
from journal.models import EventKind, Run, RunStatus, SessionEvent
from runs.models import API_SCOPES, ApiToken, AuditEntry
from tests.agents import timetravel  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")


@pytest.fixture
def parent(drive) -> str:
    run_id = journal.start("tt-state", 4)  # add x4 on ctx.state's total, then a verdict
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    return run_id


@pytest.fixture
def operator(client, personas):
    client.force_login(personas["operator"])
    return client


def act(client, run_id, **data):
    return client.post(reverse("run_act", args=[run_id, "fork_state"]), data, **HX)


def textarea(body: str, element_id: str) -> str:
    start = body.index(f'id="{element_id}"')
    return body[body.index(">", start) + 1:body.index("</textarea>", start)]


def test_the_stepper_offers_a_state_fork_prefilled_with_the_state_at_the_step(operator, parent):
    resp = operator.get(reverse("run_detail", args=[parent]) + "?step=3")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert "Fork with edited state" in body and 'id="fork-state-submit" disabled' in body
    prefilled = json.loads(textarea(body, "fork-state").replace("&quot;", '"'))
    assert prefilled == {"total": 3, "seen": [1, 2]} == journal.state_at(parent, 3).state
    # the re-run and the edited-result forms are still there beside it
    assert 'id="rerun-submit"' in body and 'id="fork-submit" disabled' in body


def test_a_state_fork_from_the_dashboard_runs_on_the_edited_state_and_is_audited(operator, parent, drive):
    resp = act(operator, parent, at_step="3", edit_state="on", reason="try 100",
               state='{"total": 100, "seen": ["edited"]}')
    assert resp.status_code == 200, resp.content
    new_id = resp["HX-Redirect"].strip("/").split("/")[-1]
    drive()
    child = Run.objects.get(id=new_id)
    assert child.output == {"total": 107, "seen": ["edited", 3, 4], "verdict": "reject"}
    assert (str(child.forked_from_id), child.fork_step) == (parent, 3)
    entry = AuditEntry.objects.get(action="fork_state")
    assert entry.ok and entry.comment == "try 100" and entry.actor == "operator"
    action = SessionEvent.objects.get(run_id=new_id, kind=EventKind.OPERATOR_ACTION)
    assert action.payload["state"] is True and action.actor == "operator"
    # The fork's stepper: replayed before the fork step, ran anew with the edited state from it on.
    page = operator.get(reverse("run_detail", args=[new_id]) + "?step=2").content.decode()
    assert "replayed from the parent" in page and 'id="step-state-edited"' not in page
    page = operator.get(reverse("run_detail", args=[new_id]) + "?step=3").content.decode()
    assert "ran anew in this fork" in page and "edited state by operator" in page
    assert operator.get(reverse("run_detail", args=[new_id]) + "?step=5").status_code == 200


@pytest.mark.parametrize(("data", "message"), [
    ({"state": '{"total": 100, "seen": []}'}, "tick"),  # the pre-filled (or edited) text alone never forks
    ({"edit_state": "on", "state": "  "}, "edited state is empty"),
    ({"edit_state": "on", "state": "[1, 2]"}, "must be a JSON object"),
    ({"edit_state": "on", "state": "{nope"}, "not valid JSON"),
    ({"edit_state": "on", "state": '{"x": NaN}'}, "cannot be stored"),
    ({"edit_state": "on", "state": "{}", "at_step": "99"}, "positions 1..5"),
])
def test_a_state_fork_the_user_did_not_ask_for_or_cannot_store_is_refused(operator, parent, data, message):
    runs = Run.objects.count()
    body = act(operator, parent, **{"at_step": "3", **data}).content.decode()
    assert message in body and "msg error" in body
    assert Run.objects.count() == runs


def test_a_viewer_cannot_fork(client, personas, parent):
    client.force_login(personas["viewer"])
    resp = act(client, parent, at_step="3", edit_state="on", state="{}")
    assert resp.status_code == 403 and Run.objects.count() == 1


def test_the_api_forks_with_an_edited_state(parent, drive):
    secret = ApiToken.issue("robot", list(API_SCOPES))[1]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    resp = api.post(f"/api/runs/{parent}/fork", json.dumps({"at_step": 3, "state": {"total": 100, "seen": []}}),
                    content_type="application/json")
    assert resp.status_code == 201, resp.content
    drive()
    assert journal.get_run(resp.json()["run_id"]).output["total"] == 107
    bad = api.post(f"/api/runs/{parent}/fork", json.dumps({"at_step": 3, "state": [1]}),
                   content_type="application/json")
    assert bad.status_code in (400, 422) and Run.objects.count() == 2
