"""The dashboard in a real browser: Playwright driving Debian's Chromium against a live server.

Screenshots of the main pages land in test-output/screenshots/ (gitignored) for people to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import pytest

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs an event loop in this thread

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "screenshots"

playwright_sync = pytest.importorskip("playwright.sync_api")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian's chromium is not installed at /usr/bin/chromium"),
]

import journal  # noqa: E402
from journal.models import Run, RunStatus  # noqa: E402
from tests.dashboard_data import make_demo_runs  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors
    yield pg
    context.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def login(page, live_server, role: str) -> None:
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", role)
    page.fill("#id_password", f"{role}-pass")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def test_operator_filters_opens_a_failed_run_steps_with_the_keyboard_and_forks(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    page.goto(f"{live_server.url}/")
    shot(page, "00-login")
    login(page, live_server, "operator")
    shot(page, "01-runs-list")
    assert page.locator("table.runs tbody tr").count() == 6

    page.check("input[name=status][value=failed]")
    page.click(".filters button[type=submit]")
    page.wait_for_url(re.compile(r"status=failed"))
    rows = page.locator("table.runs tbody tr")
    assert rows.count() == 2
    assert all("Failed" in t for t in rows.all_inner_texts())
    shot(page, "02-runs-filtered")

    page.click(f"a[href='/runs/{demo.failed}/']")
    page.wait_for_url(f"{live_server.url}/runs/{demo.failed}/")
    assert "unexpected token" in page.inner_text("#run-header")
    assert page.inner_text("#step-title").startswith("Step 3:")
    shot(page, "03-run-detail-failed")

    page.keyboard.press("ArrowLeft")
    page.wait_for_function("document.querySelector('#step-title').textContent.startsWith('Step 2:')")
    assert page.url.endswith("?step=2")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("document.querySelector('#step-title').textContent.startsWith('Step 1:')")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.querySelector('#step-title').textContent.startsWith('Step 2:')")
    assert "summarize_doc" in page.inner_text("#step-title")
    shot(page, "04-stepper-step-2")

    page.click("details.fork summary")
    assert page.is_disabled("#fork-submit")  # forking with an edited result needs the box ticked
    page.click("#rerun-submit")
    page.wait_for_url(re.compile(r"/runs/(?!" + demo.failed + r")[0-9a-f-]{36}/$"))
    new_id = page.url.rstrip("/").split("/")[-1]
    fork = Run.objects.get(id=new_id)
    assert str(fork.forked_from_id) == demo.failed and fork.fork_step == 2
    assert "Forked from" in page.inner_text(".lineage")
    shot(page, "05-forked-run")
    assert not page.js_errors, page.js_errors


def test_at_a_failed_step_the_fork_form_offers_rerun_and_an_edit_only_when_ticked(page, live_server, personas,
                                                                                  drive):
    demo = make_demo_runs(drive)
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/runs/{demo.failed}/?step=3")
    assert page.locator("details.fork").get_attribute("open") is not None  # open by default at a failed step
    assert page.input_value("#fork-override") == ""  # the error is not offered as the step's result
    assert page.is_disabled("#fork-submit")
    page.fill("#fork-override", '"typed, not ticked"')
    assert page.is_disabled("#fork-submit")
    shot(page, "20-fork-form-failed-step")
    page.click("#rerun-submit")
    page.wait_for_url(re.compile(r"/runs/(?!" + demo.failed + r")[0-9a-f-]{36}/$"))
    rerun = Run.objects.get(id=page.url.rstrip("/").split("/")[-1])
    assert rerun.fork_step == 3
    assert not any(e.payload.get("overridden") for e in rerun.events.all())

    page.goto(f"{live_server.url}/runs/{demo.failed}/?step=3")
    page.check("#fork-edit")
    assert not page.is_disabled("#fork-submit")
    page.fill("#fork-override", '"a clean result"')
    page.click("#fork-submit")
    page.wait_for_url(re.compile(r"/runs/(?!" + demo.failed + "|" + str(rerun.id) + r")[0-9a-f-]{36}/$"))
    edited = Run.objects.get(id=page.url.rstrip("/").split("/")[-1])
    drive()
    edited.refresh_from_db()
    assert edited.status == RunStatus.COMPLETED and edited.output == "a clean result"
    assert not page.js_errors, page.js_errors


def test_approve_from_the_inbox_and_watch_the_run_complete_without_reloading(page, live_server, personas, drive):
    from journal.driver.worker import EmbeddedWorker

    run_id = journal.start("dash_review", "launch-plan.md")
    drive()
    assert Run.objects.get(id=run_id).status == RunStatus.SUSPENDED
    login(page, live_server, "operator")
    assert page.inner_text("#approvals-badge") == "1"
    page.click("nav >> text=Approvals")
    page.wait_for_url(f"{live_server.url}/approvals/")
    assert "Publish launch-plan.md?" in page.inner_text("#inbox")
    shot(page, "06-approvals-inbox")

    page.fill(".decide textarea[name=comment]", "ship it")
    page.click(".decide button[value=accept]")
    page.wait_for_selector("#inbox >> text=Nothing is waiting for a decision")
    page.click(f"a[href='/runs/{run_id}/']") if page.locator(f"a[href='/runs/{run_id}/']").count() else \
        page.goto(f"{live_server.url}/runs/{run_id}/")
    page.wait_for_url(f"{live_server.url}/runs/{run_id}/")
    assert page.inner_text("#run-status") == "Pending"
    page.evaluate("window.__same_page = true")

    worker = EmbeddedWorker(concurrency=1, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"max_seconds": 60}, daemon=True)
    thread.start()
    try:
        page.wait_for_function("document.querySelector('#run-status').textContent.trim() === 'Completed'",
                               timeout=30_000)
    finally:
        worker.stopping.set()
        thread.join(timeout=30)
    assert page.evaluate("window.__same_page") is True  # updated in place: no reload happened
    assert Run.objects.get(id=run_id).output["published"] is True
    shot(page, "07-approved-run-completed")
    assert not page.js_errors, page.js_errors


def test_the_inbox_keeps_a_half_typed_comment_and_an_open_editor_across_polls(page, live_server, personas, drive):
    first = journal.start("dash_review", "launch-plan.md")
    drive()
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/approvals/")
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "fragment=list" in r.url else None)
    page.fill(".decide textarea[name=comment]", "half a thought")
    page.click(".decide details summary")  # "Edit before accepting" unfolds
    page.locator("h1").click()  # focus leaves the form: the typed text alone must keep it safe
    page.wait_for_timeout(6_500)  # longer than the 5 s poll
    assert page.input_value(".decide textarea[name=comment]") == "half a thought"
    assert page.locator(".decide details").get_attribute("open") is not None
    assert not polls  # the redraw waited
    shot(page, "21-inbox-while-typing")

    page.fill(".decide textarea[name=comment]", "")
    page.click(".decide details summary")  # folded again: nothing is in use, polling goes on
    page.locator("h1").click()
    second = journal.start("dash_review", "press-kit.md")
    drive()
    page.wait_for_selector("#inbox >> text=Publish press-kit.md?", timeout=12_000)
    assert polls and Run.objects.get(id=first).status == RunStatus.SUSPENDED and second
    assert not page.js_errors, page.js_errors


def test_the_stepper_grows_live_after_a_resume_and_agrees_with_the_header(page, live_server, personas, drive):
    from journal.operations.timetravel import step_total

    run_id = journal.start("dash_grow", "doc")
    drive()
    login(page, live_server, "viewer")
    page.goto(f"{live_server.url}/runs/{run_id}/")
    before = step_total(run_id)
    assert page.inner_text("#step-total") == str(before) == page.inner_text("#header-steps").split()[0]
    page.evaluate("window.__same_page = true")
    journal.signal(run_id, "more", {})
    drive()
    after = step_total(run_id)
    page.wait_for_function(f"document.querySelector('#step-total').textContent.trim() === '{after}'",
                           timeout=15_000)
    page.wait_for_function(f"document.querySelector('#header-steps').textContent.trim().startsWith('{after}')",
                           timeout=15_000)
    assert page.evaluate("window.__same_page") is True and after > before
    shot(page, "22-stepper-grown")
    assert not page.js_errors, page.js_errors


def test_arrow_keys_on_a_focused_tab_move_between_tabs_not_the_stepper(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    login(page, live_server, "viewer")
    page.goto(f"{live_server.url}/runs/{demo.failed}/")
    assert page.inner_text("#step-title").startswith("Step 3:")
    page.focus("#t-events")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#t-checkpoints", "aria-selected") == "true"
    assert page.evaluate("document.activeElement.id") == "t-checkpoints"
    assert not page.is_hidden("#tab-checkpoints") and page.is_hidden("#tab-events")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")  # wraps round to the last tab
    assert page.get_attribute("#t-trace", "aria-selected") == "true"
    page.wait_for_timeout(300)
    assert page.inner_text("#step-title").startswith("Step 3:") and "step=" not in page.url  # the stepper stayed
    page.locator("h1").click()
    page.keyboard.press("ArrowLeft")  # elsewhere the keys still step
    page.wait_for_function("document.querySelector('#step-title').textContent.startsWith('Step 2:')")
    assert not page.js_errors, page.js_errors


def test_a_run_waiting_for_approval_shows_the_decision_above_the_stepper(page, live_server, personas, drive):
    run_id = journal.start("dash_review", "launch-plan.md")
    drive()
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/runs/{run_id}/")
    decision = page.locator("#decision").bounding_box()
    stepper = page.locator("#journal").bounding_box()
    assert decision["y"] < stepper["y"] and decision["y"] + decision["height"] < 900  # in the first screen
    shot(page, "23-decision-above-stepper")
    page.fill("#decision input[name=comment]", "fine")
    page.click("#decision button[value=accept]")
    page.wait_for_url(f"{live_server.url}/runs/{run_id}/")
    assert page.locator("#decision").count() == 0
    assert Run.objects.get(id=run_id).status == RunStatus.PENDING
    assert not page.js_errors, page.js_errors


def test_compare_two_runs_selected_in_the_list(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    fork = journal.fork(demo.ok, 2, override="an edited summary", actor="t")
    drive()
    login(page, live_server, "operator")
    page.check(f"input[name=run_ids][value='{demo.ok}']")
    page.click("#compare-selected")  # one selected: says so, goes nowhere
    assert "Select exactly two runs" in page.inner_text("#flash") and page.url == f"{live_server.url}/"
    page.check(f"input[name=run_ids][value='{fork}']")
    page.click("#compare-selected")
    page.wait_for_url(re.compile(r"/runs/compare/\?a="))
    assert "First divergence at step 2." in page.inner_text("#compare-verdict")
    assert "csrfmiddlewaretoken" not in page.url
    shot(page, "24-compare")
    page.goto(f"{live_server.url}/runs/{fork}/")
    page.click("#compare-parent")
    page.wait_for_url(re.compile(r"/runs/compare/"))
    assert "First divergence at step 2." in page.inner_text("#compare-verdict")
    assert not page.js_errors, page.js_errors


def test_readable_at_390_px_without_sideways_scrolling(browser, live_server, personas, drive):
    demo = make_demo_runs(drive)
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        login(page, live_server, "operator")
        for url, name in [("/", "25-runs-390"), (f"/runs/{demo.failed}/", "26-detail-390")]:
            page.goto(f"{live_server.url}{url}")
            wide = page.evaluate("document.documentElement.scrollWidth")
            shot(page, name)
            assert wide <= 390, (url, wide)
        page.goto(f"{live_server.url}/")
        status = page.locator(f"#st-{demo.failed}").bounding_box()
        assert status and status["x"] >= 0 and status["x"] + status["width"] <= 390  # the status stays in view
    finally:
        context.close()


def test_bulk_on_a_whole_search_shows_the_count_before_acting(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/?q=status:failed")
    page.select_option("#filter-action", "retry")
    page.click("#filter-count-btn")
    page.wait_for_selector("#filter-count")
    assert "2 runs match this search (2 failed)" in page.inner_text("#filter-count")
    assert Run.objects.get(id=demo.failed).status == RunStatus.FAILED  # counting did nothing
    shot(page, "27-bulk-on-search-count")
    page.click("#filter-confirm")
    page.wait_for_selector(".msg >> text=retry: 2 run(s) retry scheduled")
    assert Run.objects.get(id=demo.failed).status == RunStatus.PENDING
    assert not page.js_errors, page.js_errors


def test_a_viewer_sees_no_actions_and_is_refused_when_trying_one(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    login(page, live_server, "viewer")
    page.goto(f"{live_server.url}/runs/{demo.waiting}/")
    assert page.locator("section.actions").count() == 0
    status = page.evaluate("""async (url) => {
        const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
        const r = await fetch(url, {method: 'POST', headers: {'X-CSRFToken': token, 'HX-Request': 'true'},
                                    body: new URLSearchParams({reason: 'sneaky'})});
        return r.status;
    }""", f"/runs/{demo.waiting}/act/cancel/")
    assert status == 403
    assert Run.objects.get(id=demo.waiting).status == RunStatus.SUSPENDED
    page.goto(f"{live_server.url}/audit/")
    assert "Not allowed" in page.inner_text("main")
    shot(page, "08-viewer-refused")


def test_agent_output_cannot_run_script_or_htmx_in_the_browser(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    login(page, live_server, "admin")
    for url in (f"/runs/{demo.evil}/?step=1", f"/runs/{demo.evil_failed}/", "/?q=pwned"):
        page.goto(f"{live_server.url}{url}")
        page.wait_for_timeout(300)
        assert page.evaluate("window.__pwned") is None
    assert not [u for u in requests if "/evil" in u]
    assert "<script>window.__pwned" in page.inner_text("table.runs")  # shown, as text
    shot(page, "09-inert-agent-output")


def test_screenshots_of_the_other_pages(page, live_server, personas, drive):
    demo = make_demo_runs(drive)
    from django.utils import timezone

    from journal.models import Worker

    Worker.objects.create(id="web-1:4242:a1b2c3", hostname="web-1", pid=4242, heartbeat_at=timezone.now())
    login(page, live_server, "admin")
    page.goto(f"{live_server.url}/runs/{demo.ok}/?step=2")
    page.wait_for_selector("#gantt-data", state="attached")
    page.wait_for_function("document.querySelector('[data-chart] .main-svg') !== null")
    shot(page, "10-run-detail-completed")
    for name, url in (("11-overview", "/overview/"), ("12-workers", "/workers/"), ("13-audit", "/audit/"),
                      ("14-roles", "/settings/roles/")):
        page.goto(f"{live_server.url}{url}")
        if name == "11-overview":
            page.wait_for_function("document.querySelectorAll('[data-chart] .main-svg').length >= 4")
        shot(page, name)
    assert not page.js_errors, page.js_errors


def test_dark_mode_follows_the_system(browser, live_server, personas, drive):
    demo = make_demo_runs(drive)
    context = browser.new_context(viewport={"width": 1360, "height": 900}, color_scheme="dark")
    try:
        pg = context.new_page()
        login(pg, live_server, "operator")
        background = pg.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(18, 20, 24)", background
        shot(pg, "15-runs-list-dark")
        pg.goto(f"{live_server.url}/runs/{demo.failed}/")
        shot(pg, "16-run-detail-dark")
    finally:
        context.close()


def test_a_langgraph_interrupt_waits_in_the_inbox_and_approving_it_in_the_browser_resumes_the_graph(
        page, live_server, personas, drive):
    from journal.contrib.langgraph import start
    from tests.agents import langgraph_crashy  # noqa: F401  (registers lg-refund)

    run_id = start("lg-refund", {"order": "A-7"})
    drive()
    assert Run.objects.get(id=run_id).waiting_for["kind"] == "approval"
    login(page, live_server, "operator")
    for question in ("manager: send 'refund order A-7'?", "finance: send 'refund order A-7'?"):
        page.goto(f"{live_server.url}/approvals/")
        assert question in page.inner_text("#inbox")
        page.click(".decide button[value=accept]")
        page.wait_for_selector("#inbox >> text=Nothing is waiting for a decision")
        drive()  # the graph resumes from its checkpoint with the decision as interrupt()'s value
    run = Run.objects.get(id=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["sent"] == "refund order A-7"
    assert [v.split(" (")[0] for v in run.output["verdicts"]] == ["manager approved", "finance approved"]
    assert not page.js_errors, page.js_errors


def test_what_if_a_model_call_had_used_the_large_model_opens_the_compare_view(page, live_server, personas, drive,
                                                                               monkeypatch, tmp_path):
    from journal.models import SessionEvent

    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)  # the offline scripted models
    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path / "outbox"))
    run_id = journal.start("research", "durable execution for AI agents")
    drive()
    model_steps = list(SessionEvent.objects.steps().filter(run_id=run_id, step_name__startswith="model:")
                       .order_by("position").values_list("position", "step_name"))
    position, used = model_steps[-1]
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/runs/{run_id}/?step={position}")
    page.click("details.whatif summary")
    assert page.input_value("#whatif-model") == used.removeprefix("model:")
    page.select_option("#whatif-model", "scripted-large")
    page.click("#whatif-submit")
    page.wait_for_url(re.compile(r"/runs/compare/\?a=" + run_id + r"&b=[0-9a-f-]{36}$"))
    fork_id = page.url.rsplit("b=", 1)[1]
    fork = Run.objects.get(id=fork_id)
    assert fork.forked_from_id is not None and str(fork.forked_from_id) == run_id and fork.fork_step == position
    drive()
    page.reload()
    table = page.inner_text("table.compare")
    assert "scripted-large" in table and used.removeprefix("model:") in table  # both answers, side by side
    assert f"First divergence at step {position}" in page.inner_text("#compare-verdict")
    shot(page, "30-what-if-compare")
    from runs.models import AuditEntry

    assert AuditEntry.objects.filter(action="whatif", ok=True).exists()
    assert not page.js_errors, page.js_errors


def test_bulk_on_a_whole_search_counts_first_then_shows_live_progress_to_the_end(page, live_server, personas, drive,
                                                                                   settings):
    from runs.models import AuditEntry, BulkJob

    settings.DASHBOARD_BULK_INLINE_MAX = 3  # more than a handful goes to the background
    demo = make_demo_runs(drive)
    failed = [demo.failed, *(journal.start("dash_fail", f"f{i}.csv") for i in range(8))]
    drive(concurrency=4)
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/?q=step:fetch_doc")  # 9 failed, 1 completed, 2 suspended runs ran it
    page.select_option("#filter-action", "retry")
    page.click("#filter-count-btn")
    page.wait_for_selector("#filter-count")
    assert "12 runs match this search (1 completed, 9 failed, 2 suspended)" in page.inner_text("#filter-count")
    assert not BulkJob.objects.exists() and Run.objects.get(id=demo.failed).status == RunStatus.FAILED
    shot(page, "28-bulk-on-search-background-count")

    page.click("#filter-confirm")
    page.wait_for_url(re.compile(r"/runs/bulk/[0-9a-f-]{36}/$"))
    assert page.locator("#bulk-bar").count() == 1
    page.wait_for_selector("#bulk-progress[data-state=finished]", timeout=60_000)  # swapped in by the poll
    counts = " ".join(page.inner_text("#bulk-counts").split())
    assert counts.startswith("12 of 12 runs:") and "9 retry done" in counts and "3 refused by their state" in counts
    assert page.get_attribute("#bulk-bar", "value") == "100"
    refused = page.inner_text("#bulk-refusals")
    assert "1 completed" in refused and "2 suspended" in refused
    for run_id in (demo.ok, demo.waiting):
        assert page.locator(f"#bulk-refusals a[href='/runs/{run_id}/']").count() == 1
    assert all(s == RunStatus.PENDING for s in Run.objects.filter(id__in=failed).values_list("status", flat=True))
    assert AuditEntry.objects.filter(action="retry", ok=True).count() == 9
    shot(page, "29-bulk-on-search-background-done")
    assert not page.js_errors, page.js_errors
