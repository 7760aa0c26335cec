"""Actions on a run: each calls the engine, answers in place, and leaves an audit entry."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.urls import reverse

from journal.models import Run, RunStatus, SessionEvent
from runs.models import AuditEntry
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def demo(drive):
    return make_demo_runs(drive)


@pytest.fixture
def operator(client, personas):
    client.force_login(personas["operator"])
    return client


def act(client, run_id, action, **data):
    return client.post(reverse("run_act", args=[run_id, action]), data, **HX)


def test_cancel_cancels_and_audits_with_the_reason(operator, demo):
    resp = act(operator, demo.waiting, "cancel", reason="customer withdrew")
    body = resp.content.decode()
    assert resp.status_code == 200 and 'id="action-result"' in body and "customer withdrew" in body
    assert resp["HX-Trigger"] == "run-changed"
    run = Run.objects.get(id=demo.waiting)
    assert run.status == RunStatus.CANCELLED and run.cancelled_by == "operator"
    entry = AuditEntry.objects.get(action="cancel")
    assert entry.actor == "operator" and str(entry.run_id) == demo.waiting and entry.ok
    assert entry.comment == "customer withdrew"


def test_refused_action_shows_the_engine_message_and_is_audited(operator, demo):
    body = act(operator, demo.ok, "cancel").content.decode()
    assert "already completed" in body and "msg error" in body
    assert not AuditEntry.objects.get(action="cancel").ok


def test_signal_with_valid_json_wakes_the_run(operator, demo, drive):
    body = act(operator, demo.waiting, "signal", name="approval", payload='{"approved": true}').content.decode()
    assert "delivered" in body
    drive()
    run = Run.objects.get(id=demo.waiting)
    assert run.status == RunStatus.COMPLETED and run.output["approved"] is True
    assert run.output["decision"] == {"approved": True}


def test_signal_with_invalid_json_is_refused_and_nothing_is_sent(operator, demo):
    body = act(operator, demo.waiting, "signal", name="approval", payload="{approved: yes").content.decode()
    assert "not valid JSON" in body
    assert not SessionEvent.objects.filter(run_id=demo.waiting, kind="signal_received").exists()
    from journal.models import Signal

    assert not Signal.objects.filter(run_id=demo.waiting).exists()
    assert Run.objects.get(id=demo.waiting).status == RunStatus.SUSPENDED


def test_pause_and_unpause(operator, demo):
    assert "paused" in act(operator, demo.waiting, "pause", reason="investigating").content.decode()
    assert Run.objects.get(id=demo.waiting).paused
    act(operator, demo.waiting, "unpause")
    assert not Run.objects.get(id=demo.waiting).paused
    assert list(AuditEntry.objects.order_by("id").values_list("action", "ok")) == [("pause", True),
                                                                                    ("unpause", True)]


def test_fork_from_a_step_redirects_to_the_new_run(operator, demo, drive):
    resp = act(operator, demo.ok, "fork", at_step="2", reason="what if")
    assert resp.status_code == 200, resp.content
    new_url = resp["HX-Redirect"]
    new_id = new_url.strip("/").split("/")[-1]
    new = Run.objects.get(id=new_id)
    assert str(new.forked_from_id) == demo.ok and new.fork_step == 2
    drive()
    assert Run.objects.get(id=new_id).status == RunStatus.COMPLETED
    entry = AuditEntry.objects.get(action="fork")
    assert entry.ok and entry.comment == "what if"


def test_fork_with_an_edited_result(operator, demo, drive):
    resp = act(operator, demo.ok, "fork", at_step="2", edit="on", override='"an edited summary"')
    new_id = resp["HX-Redirect"].strip("/").split("/")[-1]
    drive()
    assert Run.objects.get(id=new_id).output == {"summary": "an edited summary"}


def _override_events(run_id):
    return [e for e in SessionEvent.objects.filter(run_id=run_id, kind="step_completed") if e.payload.get("overridden")]


def test_fork_with_the_box_unchecked_never_overrides_even_with_text_in_the_textarea(operator, demo):
    # the page pre-fills the textarea with the recorded result (or a failed step's error): that text alone
    # must not become the step's result
    resp = act(operator, demo.failed, "fork", at_step="3", override='{"error": "unexpected token"}')
    new_id = resp["HX-Redirect"].strip("/").split("/")[-1]
    new = Run.objects.get(id=new_id)
    assert new.fork_step == 3 and not _override_events(new_id)
    assert not SessionEvent.objects.filter(run_id=new_id, position=3).exists()  # step 3 runs anew
    entry = AuditEntry.objects.get(action="fork")
    assert entry.ok and "re-running from step 3" in entry.result


def test_rerun_from_a_failed_step_executes_it_again(operator, demo, drive):
    resp = act(operator, demo.failed, "rerun", at_step="3", reason="after the fix", override='"ignored"', edit="on")
    assert resp.status_code == 200, resp.content
    new_id = resp["HX-Redirect"].strip("/").split("/")[-1]
    assert Run.objects.get(id=new_id).fork_step == 3 and not _override_events(new_id)
    drive()
    new = Run.objects.get(id=new_id)
    assert new.status == RunStatus.FAILED and "unexpected token" in new.error  # it ran step 3 again, no KeyError
    entry = AuditEntry.objects.get(action="rerun")
    assert entry.ok and entry.comment == "after the fix"


def test_fork_with_the_box_checked_and_nothing_written_is_refused(operator, demo):
    body = act(operator, demo.ok, "fork", at_step="2", edit="on", override="  ").content.decode()
    assert "edited result is empty" in body and Run.objects.count() == 6
    body = act(operator, demo.ok, "fork", at_step="2", edit="on", override="null").content.decode()
    assert "null cannot be an edited result" in body and Run.objects.count() == 6


def test_the_fork_form_defaults_to_rerun_at_a_failed_step(operator, demo):
    body = operator.get(reverse("run_detail", args=[demo.failed]) + "?step=3").content.decode()
    assert 'id="rerun-submit"' in body and "Re-run from step 3" in body
    assert '<details class="fork" open>' in body
    textarea = body[body.index('id="fork-override"'):]
    textarea = textarea[:textarea.index("</textarea>")]
    assert "unexpected token" not in textarea  # the error is not offered as a result
    assert 'id="fork-submit" disabled' in body
    ok = operator.get(reverse("run_detail", args=[demo.ok]) + "?step=2").content.decode()
    assert '<details class="fork">' in ok  # closed at a step that succeeded


def test_fork_with_bad_json_changes_nothing(operator, demo):
    body = act(operator, demo.ok, "fork", at_step="2", edit="on", override="{nope").content.decode()
    assert "not valid JSON" in body
    assert Run.objects.count() == 6


def test_replay_check_reports_in_place(operator, demo):
    body = act(operator, demo.ok, "replay_check").content.decode()
    assert "replay check passed" in body


def test_retry_a_failed_run(operator, demo):
    body = act(operator, demo.failed, "retry", reason="flaky parser").content.decode()
    entry = AuditEntry.objects.get(action="retry")
    assert entry.result in body
    if entry.ok:  # the engine accepted it: the run is runnable again
        assert Run.objects.get(id=demo.failed).status != RunStatus.FAILED


def test_resolve_effect_validates_its_form(operator, demo):
    body = act(operator, demo.ok, "resolve_effect", position="x", resolution="done").content.decode()
    assert "choose the step position" in body
    body = act(operator, demo.ok, "resolve_effect", position="1", resolution="explode").content.decode()
    assert "resolution must be one of" in body
    body = act(operator, demo.ok, "resolve_effect", position="1", resolution="done").content.decode()
    assert "msg error" in body  # the engine refuses: no effect is in doubt at step 1
    assert not AuditEntry.objects.get(action="resolve_effect").ok


def test_unknown_action_is_404(operator, demo):
    assert act(operator, demo.ok, "explode").status_code == 404


def test_without_htmx_actions_redirect_back_with_a_message(operator, demo):
    resp = operator.post(reverse("run_act", args=[demo.waiting, "cancel"]), {"reason": "r"}, follow=True)
    assert resp.redirect_chain[-1][0] == reverse("run_detail", args=[demo.waiting])
    assert "cancel requested" in resp.content.decode()


def test_read_only_setting_refuses_every_write(operator, demo, settings):
    settings.DURABLE_READ_ONLY = True
    resp = act(operator, demo.waiting, "cancel")
    assert resp.status_code == 403
    assert Run.objects.get(id=demo.waiting).status == RunStatus.SUSPENDED
    page = operator.get(reverse("run_detail", args=[demo.waiting])).content.decode()
    assert "read-only" in page and 'id="cancel-btn"' not in page


def test_compensate_a_cancelled_run_undoes_its_effects(operator, drive):
    import journal
    from journal.models import SideEffect

    run_id = journal.start("dash_checkout", 120)
    drive()
    act(operator, run_id, "cancel", reason="customer left")
    assert Run.objects.get(id=run_id).status == RunStatus.CANCELLED
    body = act(operator, run_id, "compensate", reason="refund the customer").content.decode()
    assert "compensation started" in body
    drive()
    assert Run.objects.get(id=run_id).status == RunStatus.COMPENSATED
    effect = SideEffect.objects.get(run_id=run_id)
    assert effect.status == "compensated" and effect.compensation_result == {"refunded": 120}
    assert "compensated" in operator.get(reverse("run_detail", args=[run_id])).content.decode()


def _lifecycle_buttons(body: str) -> set[str]:
    import re

    return set(re.findall(r"hx-post=\"/runs/[0-9a-f-]+/act/(resume|retry|compensate|cancel|pause|unpause)/\"", body))


def test_actions_follow_the_runs_state(operator, demo):
    done = operator.get(reverse("run_detail", args=[demo.ok])).content.decode()
    assert _lifecycle_buttons(done) == set()
    assert "Send a signal" not in done
    for name in ("resume", "retry", "compensate", "cancel", "signal"):
        assert f"<li>{name}: not offered, it is completed</li>" in done
    failed = operator.get(reverse("run_detail", args=[demo.failed])).content.decode()
    assert _lifecycle_buttons(failed) == {"retry"}  # dash_fail made no effect with a compensation
    assert "compensate: not offered, it has no completed effect with a compensation to undo" in failed
    waiting = operator.get(reverse("run_detail", args=[demo.waiting])).content.decode()
    assert _lifecycle_buttons(waiting) == {"cancel", "pause"} and "Send a signal" in waiting


def test_allowed_actions_agree_with_what_the_engine_accepts(operator, demo):
    import journal
    from journal.operations.runs import allowed_actions

    for run_id in (demo.ok, demo.failed, demo.waiting):
        run = Run.objects.get(id=run_id)
        allowed = allowed_actions(run)
        for name in ("resume", "retry", "compensate"):
            try:
                with transaction.atomic():
                    getattr(journal, name)(run_id, actor="t")
                    raise Rollback
            except Rollback:
                accepted = True
            except journal.DurableError:
                accepted = False
            assert accepted == (name in allowed), (run.status, name)


class Rollback(Exception):
    """Undo an accepted action so the next one sees the run as it was."""


def test_a_what_if_forks_a_model_call_onto_another_model_and_opens_the_compare_view(operator, drive, monkeypatch,
                                                                                      tmp_path):
    import journal

    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path))
    run_id = journal.start("research", "sagas")
    drive()
    step = SessionEvent.objects.steps().filter(run_id=run_id, step_name="model:scripted-small").first().position
    refused = {
        "gpt-99": "is not one of the configured models",
        "": "choose another model or a temperature",
    }
    for model, message in refused.items():
        body = act(operator, run_id, "whatif", at_step=step, model=model, used_model="scripted-small").content
        assert message in body.decode()
    body = act(operator, run_id, "whatif", at_step=step, model="scripted-small", used_model="scripted-small",
               temperature="7").content.decode()
    assert "temperature must be a number from 0 to 2" in body
    assert Run.objects.filter(forked_from_id=run_id).count() == 0  # nothing was refused half-way
    resp = act(operator, run_id, "whatif", at_step=step, model="scripted-large", used_model="scripted-small",
               temperature="0.5", reason="does the big model cite better?")
    fork = Run.objects.get(forked_from_id=run_id)
    assert resp["HX-Redirect"] == f"{reverse('run_compare')}?a={run_id}&b={fork.id}"
    assert fork.input["llm_override"] == {"from_step": step, "model": "scripted-large",
                                          "params": {"temperature": 0.5}, "original_model": "scripted-small"}
    entry = AuditEntry.objects.get(action="whatif")
    assert entry.ok and entry.comment == "does the big model cite better?"
