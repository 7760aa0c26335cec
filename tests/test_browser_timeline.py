"""The run page's timeline on a long journal, in Chromium: the window moves to the end of the run, a click on
a bar opens its step, the chosen tab stays chosen, nothing scrolls sideways at 390 px.

Screenshots land in test-output/screenshots/ beside test_browser.py's.
"""

from __future__ import annotations

import pytest

import tests.test_browser as base
from tests.test_browser import CHROMIUM, login, playwright_sync, shot

browser, page = base.browser, base.page  # test_browser.py's fixtures: one Chromium per module, a page per test

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(playwright_sync is None, reason="playwright is not installed"),
    pytest.mark.skipif(not __import__("shutil").which(CHROMIUM), reason="no /usr/bin/chromium"),
]

from tests.long_journal import seed_long_run  # noqa: E402

STEPS = 10_000


def chart_drawn(pg) -> None:
    pg.wait_for_function("document.querySelector('#timeline-chart .main-svg') !== null")


def test_the_waterfall_moves_to_the_end_of_a_long_run_and_a_click_on_a_bar_opens_that_step(page, live_server,
                                                                                             personas):
    run_id = seed_long_run(STEPS)
    login(page, live_server, "viewer")
    page.goto(f"{live_server.url}/runs/{run_id}/?step=1")
    chart_drawn(page)
    assert page.inner_text("#window-label").startswith("Steps 1–101 of 10,000")
    assert page.inner_text("#step-title").startswith("Step 1:")
    assert page.evaluate("document.getElementById('timeline-chart').layout.shapes.length") == 1  # step 1 marked
    shot(page, "40-timeline-first-steps")

    page.evaluate("window.__same_page = true")
    page.click("#window-last")
    page.wait_for_function("document.querySelector('#window-label').textContent.startsWith('Steps 9,900–10,000')")
    chart_drawn(page)
    ticks = page.eval_on_selector_all("#timeline-chart .ytick text", "els => els.map(e => e.textContent)")
    assert ticks[0] == "9900 fetch_doc" and "10000 fetch_doc" in ticks  # every row labelled, in time order
    assert len(ticks) == 101 + 11  # 101 steps and the model calls of steps 9,900, 9,910, … 10,000
    assert page.url.endswith("from=9900&to=10000") and page.evaluate("window.__same_page") is True
    shot(page, "41-timeline-last-steps")

    # a click on the bar of step 9,950 (a model call's row is "9950 model:scripted-small") opens it
    row = ticks.index("9950 fetch_doc")
    bar = page.locator("#timeline-chart .trace.bars").first.locator(".point path").nth(
        row - sum(1 for t in ticks[:row] if "model:" in t))
    bar.scroll_into_view_if_needed()
    bar.click(force=True)
    page.wait_for_function("document.querySelector('#step-title').textContent.startsWith('Step 9950:')")
    assert page.url.endswith("?step=9950") and page.evaluate("window.__same_page") is True
    # the mark moved with the stepper: the band lies over step 9,950's time, and only its bar is outlined
    page.wait_for_function("document.getElementById('timeline-chart').layout.meta.current === 9950")
    band, times = page.evaluate("""() => { const el = document.getElementById('timeline-chart');
        return [el.layout.shapes.map(s => [s.x0, s.x1]), el.layout.meta.steps['9950']]; }""")
    assert band == [times]
    outlined = page.evaluate("""() => document.getElementById('timeline-chart').data.flatMap(t =>
        t.customdata.filter((_, i) => t.marker.line.width[i] > 0))""")
    assert set(outlined) == {9950}  # its step bar and its model call's
    shot(page, "42-timeline-click-moved-the-stepper")
    assert not page.js_errors, page.js_errors


def test_moving_the_window_keeps_the_chosen_tab_and_its_rows_follow(page, live_server, personas):
    run_id = seed_long_run(2_000)
    login(page, live_server, "viewer")
    page.goto(f"{live_server.url}/runs/{run_id}/")
    chart_drawn(page)
    assert page.inner_text("#t-trace") == "Trace (2,200)" and page.inner_text("#t-events") == "Events (2,002)"
    page.click("#t-trace")
    page.click("#window-earlier")
    page.wait_for_function("document.querySelector('#window-label').textContent.startsWith('Steps 1,799–1,899')")
    # the tab is chosen again once htmx settles the swapped-in tabs
    page.wait_for_function("document.querySelector('#t-trace').getAttribute('aria-selected') === 'true'")
    assert not page.is_hidden("#tab-trace")
    first = page.locator("#tab-trace tbody tr").first.inner_text()
    assert first.startswith("1799")
    page.fill("#window-from", "500")
    page.fill("#window-to", "520")
    page.click(".window-form button")
    page.wait_for_function("document.querySelector('#window-label').textContent.startsWith('Steps 500–520')")
    assert page.locator("#tab-trace tbody tr").first.inner_text().startswith("500")
    shot(page, "43-timeline-window-form")
    assert not page.js_errors, page.js_errors


def test_a_long_run_at_390_px_scrolls_only_down_and_the_favicon_answers(browser, live_server, personas):
    run_id = seed_long_run(2_000)
    context = browser.new_context(viewport={"width": 390, "height": 844})
    pg = context.new_page()
    try:
        login(pg, live_server, "operator")
        pg.goto(f"{live_server.url}/runs/{run_id}/")
        chart_drawn(pg)
        wide = pg.evaluate("document.documentElement.scrollWidth")
        shot(pg, "44-long-run-390")
        assert wide <= 390, wide
        response = pg.goto(f"{live_server.url}/favicon.ico")
        assert response.status == 200 and "svg" in response.headers["content-type"]
    finally:
        context.close()


def test_header_fields_wrap_between_words_not_inside_them(page, live_server, personas):
    run_id = seed_long_run(20)
    login(page, live_server, "viewer")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/runs/{run_id}/")
    assert page.locator(".facts dd:not(.mono)").count() >= 6
    # a word broken across lines has more than one line box (the run id, one long token, may break)
    split = page.evaluate("""() => {
        const out = [];
        for (const dd of document.querySelectorAll('.facts dd:not(.mono)')) {
          const walker = document.createTreeWalker(dd, NodeFilter.SHOW_TEXT);
          for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (const m of node.textContent.matchAll(/\\S+/g)) {
              const r = document.createRange();
              r.setStart(node, m.index);
              r.setEnd(node, m.index + m[0].length);
              const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));
              if (tops.size > 1) out.push(m[0]);
            }
          }
        }
        return out;
    }""")
    shot(page, "45-header-390")
    assert split == [], split


def test_at_390_px_the_navigation_folds_behind_a_menu_button(browser, live_server, personas):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    pg = context.new_page()
    try:
        login(pg, live_server, "operator")
        assert pg.is_hidden("#main-nav") and pg.get_attribute("#nav-toggle", "aria-expanded") == "false"
        shot(pg, "46-nav-folded-390")
        pg.click("#nav-toggle")
        assert pg.is_visible("#main-nav >> text=Approvals")
        assert pg.get_attribute("#nav-toggle", "aria-expanded") == "true"
        shot(pg, "47-nav-open-390")
        pg.set_viewport_size({"width": 1360, "height": 900})
        assert pg.is_visible("#main-nav") and pg.is_hidden("#nav-toggle")  # wide: always shown, no button
    finally:
        context.close()


def test_the_overview_legends_clear_their_titles_and_the_token_axis_counts_up(page, live_server, personas, drive):
    from tests.dashboard_data import make_demo_runs

    make_demo_runs(drive)
    login(page, live_server, "admin")
    page.goto(f"{live_server.url}/overview/")
    page.wait_for_function("document.querySelectorAll('[data-chart] .main-svg').length >= 4")
    overlaps = page.evaluate("""() => [...document.querySelectorAll('[data-chart]')].map(el => {
        const t = el.querySelector('.gtitle'), l = el.querySelector('.legend');
        if (!t || !l) return false;
        const a = t.getBoundingClientRect(), b = l.getBoundingClientRect();
        return !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top);
    })""")
    assert not any(overlaps), overlaps
    ticks = page.eval_on_selector_all("#fig-cost ~ [data-chart] .y2tick text, [data-chart='fig-cost'] .y2tick text",
                                      "els => els.map(e => e.textContent)")
    assert ticks and len(ticks) == len(set(ticks)) and not any(t.startswith(("−", "-")) for t in ticks), ticks
    shot(page, "48-overview-legends")
    assert not page.js_errors, page.js_errors
