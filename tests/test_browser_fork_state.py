"""Fork with edited state in Chromium: from the stepper of a native run, and from a LangGraph run's thread.

Uses the fixtures of tests/test_browser.py (Debian's Chromium through Playwright); screenshots land in
test-output/screenshots/.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.test_browser import CHROMIUM, browser, login, page, playwright_sync, shot  # noqa: F401

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not __import__("shutil").which(CHROMIUM), reason="Debian's chromium is not installed"),
]

import journal  # noqa: E402
from journal.contrib.langgraph import start as start_graph  # noqa: E402
from journal.models import Run, RunStatus  # noqa: E402
from tests.agents import langgraph_fork, timetravel  # noqa: E402, F401  (registers the agents)


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")


def new_run_url(parent: str):
    return re.compile(r"/runs/(?!" + parent + r")[0-9a-f-]{36}/$")


def test_fork_with_edited_state_from_the_stepper(page, live_server, personas, drive):  # noqa: F811
    parent = journal.start("tt-state", 4)
    drive()
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/runs/{parent}/?step=3")
    page.click("details.fork > summary")
    assert json.loads(page.input_value("#fork-state")) == {"total": 3, "seen": [1, 2]}  # the state at step 3
    assert page.is_disabled("#fork-state-submit")
    page.fill("#fork-state", '{"total": 100, "seen": ["edited"]}')
    assert page.is_disabled("#fork-state-submit")  # typing alone does not arm it
    page.check("#fork-state-edit")
    assert not page.is_disabled("#fork-state-submit")
    shot(page, "40-fork-with-edited-state-form")
    page.click("#fork-state-submit")
    page.wait_for_url(new_run_url(parent))
    child = page.url.rstrip("/").split("/")[-1]
    drive()
    run = Run.objects.get(id=child)
    assert run.status == RunStatus.COMPLETED and run.output == {"total": 107, "seen": ["edited", 3, 4],
                                                                "verdict": "reject"}
    page.goto(f"{live_server.url}/runs/{child}/?step=3")
    assert "edited state by operator" in page.inner_text("#step-state-edited")
    assert "ran anew" in page.inner_text("#step-origin")
    shot(page, "41-state-fork-stepper-at-the-fork-step")
    page.click("#step-prev")
    page.wait_for_function("document.getElementById('step-number').textContent === '2'")
    assert "replayed from the parent" in page.inner_text("#step-origin")
    assert not page.js_errors, page.js_errors


def test_fork_a_langgraph_thread_from_a_checkpoint_with_edited_state(page, live_server, personas, drive):  # noqa: F811
    parent = start_graph("lg-fork", {"total": 1, "log": []})
    drive()
    login(page, live_server, "operator")
    page.goto(f"{live_server.url}/runs/{parent}/")
    assert page.inner_text("#thread-position") == "5"
    page.click("#thread-prev")
    page.wait_for_function("document.getElementById('thread-position').textContent === '4'")
    page.click("#thread-prev")
    page.wait_for_function("document.getElementById('thread-position').textContent === '3'")
    assert page.inner_text("#thread-nodes") == "add_one"
    page.click("#thread details.fork > summary")
    assert json.loads(page.input_value("#thread-fork-values")) == {"total": 2, "log": ["add_one->2"]}
    page.fill("#thread-fork-values", '{"total": 10, "log": ["add_one->2"]}')
    page.check("#thread-fork-edit")
    shot(page, "42-langgraph-thread-fork-form")
    page.click("#thread-fork-submit")
    page.wait_for_url(new_run_url(parent))
    child = page.url.rstrip("/").split("/")[-1]
    drive()
    assert journal.get_run(child).output == {"total": 20, "log": ["add_one->2", "double->20", "finish total=20"]}
    page.reload()
    assert page.inner_text("#thread-position") == "6"
    shot(page, "43-langgraph-thread-of-the-fork")
    assert not page.js_errors, page.js_errors
