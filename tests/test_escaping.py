"""Untrusted agent and tool output renders as inert text on every page that shows it, inside hx-disable."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.urls import reverse

import journal
from runs.models import AuditEntry
from tests.agents.dashboard_demo import EVIL
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
MARKER = "window.__pwned"


class Regions(HTMLParser):
    """Finds text containing the marker and whether an ancestor carries hx-disable."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []
        self.hits: list[bool] = []
        self.live_tags: list[str] = []  # real tags or attributes an attacker managed to inject

    def handle_starttag(self, tag, attrs):
        names = {k for k, _ in attrs}
        if tag == "script" and not dict(attrs).get("src") and not dict(attrs).get("type"):
            self.live_tags.append("inline <script>")
        if any(v and "/evil" in v for _, v in attrs) or any(v and MARKER in v for _, v in attrs):
            self.live_tags.append(f"<{tag} {attrs}>")
        if tag not in VOID:
            self.stack.append((tag, "hx-disable" in names))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if MARKER in data:
            self.hits.append(any(flag for _, flag in self.stack))


def assert_inert(html: str, where: str) -> None:
    assert "<script>window.__pwned" not in html, where
    assert '<div hx-get="/evil"' not in html and "<img src=x" not in html, where
    parser = Regions()
    parser.feed(html)
    assert not parser.live_tags, (where, parser.live_tags)
    assert parser.hits, f"{where}: the agent output is not shown at all"
    assert all(parser.hits), f"{where}: agent output outside an hx-disable region"


@pytest.fixture
def evil(drive, personas, client):
    demo = make_demo_runs(drive)
    waiting = journal.start("dash_approval", EVIL)
    reviewing = journal.start("dash_review", EVIL)
    drive()
    AuditEntry.objects.create(actor="operator", action="cancel", comment=EVIL, result=EVIL)
    client.force_login(personas["admin"])
    return demo, waiting, reviewing


def test_agent_output_is_inert_on_every_page(client, evil):
    demo, waiting, reviewing = evil
    pages = {
        "list": reverse("run_list"),
        "list filtered by the text": reverse("run_list") + "?q=pwned",
        "detail output": reverse("run_detail", args=[demo.evil]),
        "detail step": reverse("run_detail", args=[demo.evil]) + "?step=1",
        "detail error": reverse("run_detail", args=[demo.evil_failed]),
        "detail of an evil input": reverse("run_detail", args=[waiting]),
        "tail": reverse("run_tail", args=[demo.evil]) + "?after=0",
        "approvals": reverse("approvals"),
        "audit": reverse("audit"),
    }
    for where, url in pages.items():
        resp = client.get(url, HTTP_HX_REQUEST="true") if where == "tail" else client.get(url)
        assert resp.status_code in (200, 286), where
        assert_inert(resp.content.decode(), where)


def test_stepper_fragment_is_inert(client, evil):
    demo, _, _ = evil
    resp = client.get(reverse("run_detail", args=[demo.evil]), {"step": 1, "fragment": "journal"},
                      HTTP_HX_REQUEST="true")
    assert_inert(resp.content.decode(), "journal fragment")


def test_the_checker_itself_catches_raw_output():
    with pytest.raises(AssertionError):
        assert_inert(f"<div>{EVIL}</div>", "raw")
    with pytest.raises(AssertionError):
        from django.utils.html import escape

        assert_inert(f"<div>{escape(EVIL)}</div>", "escaped but outside hx-disable")
