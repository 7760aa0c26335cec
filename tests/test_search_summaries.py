"""Search by what happened, backed by summaries the engine keeps current (journal.models.search, the
Run columns failed_step / waited): each term hits and misses, malformed values are a message in a 200,
the summaries follow live runs (completed, failed at a step, suspended and resumed), and the backfill
of migration 0005 rebuilds from the journals what the engine wrote as it went."""

from __future__ import annotations

import html
import importlib
import re
import time
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import journal
import tests.agents.waiting  # noqa: F401  (registers sleeper before the registry snapshot)
from journal.models import Run, RunStatus, RunStep
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


class Escalation(Exception):
    pass


@journal.step()
def brittle_parse(text: str) -> int:
    return int(text)


@journal.workflow(name="summary_escalates")
def escalates(ctx, text: str) -> int:
    try:
        return brittle_parse(text)
    except journal.StepError as err:
        raise Escalation(f"cannot parse {text!r}") from err


@journal.workflow(name="summary_handles")
def handles(ctx, text: str) -> int:
    try:
        return brittle_parse(text)
    except journal.StepError:
        raise Escalation("gave up") from None


@pytest.fixture
def demo(drive):
    return make_demo_runs(drive)


def _listed(client, q) -> set[str]:
    resp = client.get(reverse("run_list"), {"q": q})
    assert resp.status_code == 200, q
    return set(re.findall(r'href="/runs/([0-9a-f-]{36})/"', resp.content.decode()))


def _summary(run_id):
    run = Run.objects.get(id=run_id)
    names = {(name, failed) for name, failed in RunStep.objects.filter(run_id=run_id).values_list("name", "failed")}
    return run.failed_step, run.waited, run.suspended_at, names


def test_the_summaries_follow_live_runs_completed_failed_and_suspended_then_resumed(demo, drive):
    ok = Run.objects.get(id=demo.ok)
    assert ok.failed_step == "" and ok.waited == timedelta(0) and ok.suspended_at is None
    ran = set(RunStep.objects.filter(run_id=demo.ok, failed=False).values_list("name", flat=True))
    assert {"fetch_doc", "summarize_doc", "tests.agents.dashboard_demo.fetch_doc", "dashboard_demo.fetch_doc"} <= ran
    assert not RunStep.objects.filter(run_id=demo.ok, failed=True).exists()

    failed = Run.objects.get(id=demo.failed)
    assert failed.failed_step == "tests.agents.dashboard_demo.explode"
    assert set(RunStep.objects.filter(run_id=demo.failed, failed=True).values_list("name", flat=True)) == {
        "explode", "dashboard_demo.explode", "agents.dashboard_demo.explode", "tests.agents.dashboard_demo.explode"}
    assert Run.objects.get(id=demo.evil_failed).failed_step == ""  # failed in its own code, not at a step

    waiting = Run.objects.get(id=demo.waiting)
    assert waiting.status == RunStatus.SUSPENDED and waiting.suspended_at is not None
    assert waiting.waited == timedelta(0)  # still waiting: counted when the wait ends
    time.sleep(0.3)
    journal.signal(demo.waiting, "approval", {"approved": True})
    drive()
    resumed = Run.objects.get(id=demo.waiting)
    assert resumed.status == RunStatus.COMPLETED and resumed.suspended_at is None
    assert timedelta(seconds=0.3) <= resumed.waited < timedelta(seconds=30)

    timer = journal.start("sleeper", 0.4)  # a timer: its worker claims it straight from suspended
    drive()
    time.sleep(0.5)
    drive()
    slept = Run.objects.get(id=timer)
    assert slept.status == RunStatus.COMPLETED and timedelta(seconds=0.3) <= slept.waited < timedelta(seconds=30)


def test_a_retried_run_that_completes_no_longer_failed_at_its_step(demo, drive):
    journal.retry(demo.failed, actor="tester")
    assert Run.objects.get(id=demo.failed).failed_step.endswith("explode")  # until it ends again
    drive()
    assert Run.objects.get(id=demo.failed).status == RunStatus.FAILED  # explode raises every time
    assert RunStep.objects.filter(run_id=demo.failed, failed=True).count() == 4  # replaced, not doubled


def test_a_fork_has_the_step_names_it_copied(demo, drive):
    child = journal.fork(demo.ok, at_step=2, actor="tester")  # replays step 1
    assert RunStep.objects.filter(run_id=child, name="fetch_doc", failed=False).exists()


def test_each_search_term_hits_and_misses(client, personas, demo, drive):
    client.force_login(personas["viewer"])
    everyone = {demo.ok, demo.failed, demo.waiting, demo.evil, demo.evil_failed, demo.review}
    assert _listed(client, "step:fetch_doc") == {demo.ok, demo.failed, demo.waiting, demo.review}
    assert _listed(client, "step:dashboard_demo.fetch_doc") == {demo.ok, demo.failed, demo.waiting, demo.review}
    assert _listed(client, "step:etch_doc") == set()  # the dotted parts match, not any tail of the text
    assert _listed(client, "step:no_such_step") == set()
    assert _listed(client, "failed_step:explode") == {demo.failed}
    assert _listed(client, "failed_step:fetch_doc") == set()

    Run.objects.filter(id=demo.ok).update(cost=Decimal("0.75"), tokens=1500)
    Run.objects.filter(id=demo.evil).update(cost=Decimal("0.25"), tokens=400)
    assert _listed(client, "cost:>0.5") == {demo.ok}
    assert _listed(client, "cost:>=0.25") == {demo.ok, demo.evil}
    assert _listed(client, "cost:0.2..0.3") == {demo.evil}
    assert _listed(client, "cost:>9") == set()
    assert _listed(client, "tokens:>1000") == {demo.ok}
    assert _listed(client, "tokens:400") == {demo.evil}
    assert _listed(client, "tokens:<=400") == everyone - {demo.ok}
    assert _listed(client, "tokens:>1500") == set()

    old = timezone.make_aware(timezone.datetime(2026, 10, 15, 12, 0))
    Run.objects.filter(id=demo.review).update(created_at=old)
    assert _listed(client, "created:<2026-11-01") == {demo.review}
    assert _listed(client, "created:2026-10-15") == {demo.review}  # that whole day
    assert _listed(client, "created:>2026-10-15") == everyone - {demo.review}  # after that day
    assert _listed(client, "created:>=2026-10-15") == everyone
    assert _listed(client, "created:<=2026-10-15T11:00") == set()
    assert _listed(client, "created:2026-10-01..2026-10-31") == {demo.review}

    time.sleep(0.5)
    journal.signal(demo.waiting, "approval", {"approved": True})
    drive()
    assert _listed(client, "waited:>0.4s") == {demo.waiting}
    assert _listed(client, "waited:>1h") == set()
    assert _listed(client, "waited:<1m") == everyone
    assert _listed(client, "waited:>0.4s status:completed step:fetch_doc") == {demo.waiting}  # AND
    assert _listed(client, "waited:>0.4s status:failed") == set()


def test_the_step_terms_are_one_index_lookup_not_a_journal_scan(client, personas, demo):
    client.force_login(personas["viewer"])
    with CaptureQueriesContext(connection) as queries:
        client.get(reverse("run_list"), {"q": "failed_step:explode step:fetch_doc"})
    listing = [q["sql"] for q in queries.captured_queries if "journal_run" in q["sql"] and "LIMIT" in q["sql"]]
    assert listing and all("journal_sessionevent" not in sql for sql in listing)
    assert all("journal_runstep" in sql for sql in listing)


@pytest.mark.parametrize("q, message", [
    ("waited:>soon", "waited:>soon is not understood"), ("waited:>1y", "is not understood"),
    ("cost:>lots", "cost:>lots is not understood"), ("cost:>NaN", "is not understood"),
    ("cost:>1e999", "is not understood"), ("tokens:>-5", "is not understood"),
    ("tokens:>99999999999999999999", "is not understood"), ("tokens:1.5", "is not understood"),
    ("created:>yesterday", "created:>yesterday is not understood"), ("created:>2026-13-45", "is not understood"),
    ("created:>0001-01-01T00:00+23:59", "is not understood"), ("created:..", "is not understood"),
    ("cost:>", "is not understood"), ('waited:""', "waited: needs a value"),
])
def test_a_malformed_value_is_a_message_in_the_page_not_a_500(client, personas, q, message):
    client.force_login(personas["viewer"])
    resp = client.get(reverse("run_list"), {"q": q})
    assert resp.status_code == 200 and message in html.unescape(resp.content.decode()), q


def test_the_help_lists_every_term(client, personas):
    from runs.queries import SEARCH_KEYS

    client.force_login(personas["viewer"])
    page = client.get(reverse("run_list")).content.decode()
    help_box = page[page.index('id="search-help"'):].split("</details>")[0]
    for key in ("status", "agent", "version", "id", "subject", "error", "step", "failed_step", "waited", "cost",
                "tokens", "created"):
        assert key in SEARCH_KEYS and f"<code>{key}:</code>" in help_box


def test_the_backfill_rebuilds_from_the_journals_what_the_engine_kept(demo, drive):
    time.sleep(0.2)
    journal.signal(demo.waiting, "approval", {"approved": True})
    drive()
    ids = [uuid.UUID(r) for r in (demo.ok, demo.failed, demo.waiting, demo.evil, demo.review)]
    live = {run_id: _summary(run_id) for run_id in ids}
    assert live[uuid.UUID(demo.waiting)][1] > timedelta(0) and live[uuid.UUID(demo.review)][2] is not None

    RunStep.objects.all().delete()  # as the runs were before migration 0005
    Run.objects.update(failed_step="", waited=timedelta(0), suspended_at=None)
    migration = importlib.import_module("journal.migrations.0008_search_summaries")
    migration.backfill(apps, None)

    for run_id in ids:
        failed_step, waited, suspended_at, names = _summary(run_id)
        want = live[run_id]
        assert (failed_step, names) == (want[0], want[3]), run_id
        # the journal knows when the wait began and when a worker next wrote (not when the signal came):
        # at least what the engine summed, and within the moment a worker took to claim the woken run
        assert want[1] <= waited < want[1] + timedelta(seconds=2), run_id
        assert (suspended_at is None) == (want[2] is None), run_id
        if suspended_at is not None:
            assert abs(suspended_at - want[2]) < timedelta(seconds=0.2)


def test_a_common_step_name_is_probed_per_run_with_the_same_answers(client, personas, demo, monkeypatch):
    from runs import queries

    client.force_login(personas["viewer"])
    rare = {q: _listed(client, q) for q in ("step:fetch_doc", "failed_step:explode", "step:no_such_step",
                                            "status:failed step:summarize_doc")}
    monkeypatch.setattr(queries, "COMMON_STEP", 1)  # every name counts as common: the EXISTS probe
    with CaptureQueriesContext(connection) as queries_seen:
        assert _listed(client, "step:fetch_doc") == rare["step:fetch_doc"]
    assert any("EXISTS" in q["sql"].upper() and "journal_runstep" in q["sql"] for q in queries_seen.captured_queries)
    for q, want in rare.items():
        assert _listed(client, q) == want, q


def test_a_step_failure_the_workflow_wraps_still_names_the_step_it_failed_at(drive, client, personas):
    wrapped = journal.start("summary_escalates", "x1")
    handled = journal.start("summary_handles", "x2")
    drive()
    run = Run.objects.get(id=wrapped)
    assert run.status == RunStatus.FAILED and run.error_type.endswith("Escalation")
    assert run.failed_step.endswith("brittle_parse")  # found through the exception's cause
    # `from None` still leaves the StepError as the context Python keeps: the step is where it began
    assert Run.objects.get(id=handled).failed_step.endswith("brittle_parse")
    client.force_login(personas["viewer"])
    assert _listed(client, "failed_step:brittle_parse") == {str(wrapped), str(handled)}


def test_subject_finds_the_runs_linked_to_a_subject_exactly(drive, client, personas):
    mine = journal.start_run("summary_handles", ["1"], subject="customer-42")
    other = journal.start_run("summary_handles", ["2"], subject="customer-420")
    drive()
    client.force_login(personas["viewer"])
    assert _listed(client, "subject:customer-42") == {str(mine)}  # exact: not customer-420
    assert _listed(client, 'subject:"customer-420" status:completed') == {str(other)}
    assert _listed(client, "subject:nobody") == set()
