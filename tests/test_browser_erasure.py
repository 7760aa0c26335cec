"""The erasure page in a real browser: an admin finds a subject's runs, reads the preview, confirms
with a reason and lands on the result; the erased run's page opens and shows the marker, not the data."""

from __future__ import annotations

import uuid

import pytest

from tests.test_browser import CHROMIUM, browser, login, page, shot  # noqa: F401  (fixtures)
from tests.test_erasure import _complete, _holding, sandbox_root  # noqa: F401  (the workflows and fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

import journal  # noqa: E402
from journal.models import Run  # noqa: E402
from runs.models import AuditEntry  # noqa: E402


def test_an_admin_previews_and_erases_a_subject_and_the_run_page_shows_the_marker(page, live_server, personas,  # noqa: F811
                                                                                   drive):
    tag = uuid.uuid4().hex[:10]
    subject, marker = f"customer-{tag}", f"zq-{tag}"
    run_id = _complete(drive, subject, marker)
    waiting = journal.start_run("erasure_waiting", [f"busy-{tag}"], subject=f"busy-{tag}")
    drive()

    login(page, live_server, "admin")
    page.click("nav >> text=Erasure")
    page.fill("#erasure-find input[name=subject]", f"busy-{tag}")
    page.click("#erasure-find button[type=submit]")
    preview = page.inner_text("#erasure-preview")
    assert "refused" in preview and "suspended" in preview
    assert page.locator("#erasure-confirm").count() == 0  # all or nothing: no button while a run is refused

    page.fill("#erasure-find input[name=subject]", subject)
    page.click("#erasure-find button[type=submit]")
    preview = page.inner_text("#erasure-preview")
    assert run_id[:10] in preview and "would erase" in preview and "refused" not in preview
    shot(page, "30-erasure-preview")
    page.fill("#erasure-confirm input[name=reason]", "request #5")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#erasure-confirm button[type=submit]")
    page.wait_for_selector("#erasure-result")
    assert "1 run" in page.inner_text("#erasure-result")
    shot(page, "31-erasure-done")
    assert Run.objects.get(id=run_id).is_erased and not Run.objects.get(id=waiting).is_erased
    assert AuditEntry.objects.filter(action="erase", run_id=run_id, actor="admin").exists()
    assert _holding(marker) == set()

    page.click(f"#erasure-result a[href='/runs/{run_id}/']")
    page.wait_for_url(f"{live_server.url}/runs/{run_id}/")
    assert page.inner_text("#run-erased") == "data erased"
    body = page.inner_text("body")
    assert "erased" in body and marker not in body and subject not in body
    page.keyboard.press("End")  # the stepper still walks every step
    assert not page.js_errors
    shot(page, "32-erased-run")
