"""Two runs side by side: the page renders what journal.operations.whatif.compare_runs aligns."""

from __future__ import annotations

import pytest
from django.urls import reverse

import journal
from journal.models import Run
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"])
    return client


def test_compare_a_fork_with_an_edited_result_marks_the_first_divergence(viewer, drive):
    demo = make_demo_runs(drive)
    fork = journal.fork(demo.ok, 2, override="an edited summary", actor="t")
    drive()
    body = viewer.get(reverse("run_compare"), {"a": demo.ok, "b": fork}).content.decode()
    assert "First divergence at step 2." in body and 'id="first-difference"' in body
    assert "The outputs differ." in body and "an edited summary" in body
    row = body.split('id="first-difference"')[1].split("</tr>")[0]
    assert "first divergence" in row
    # the fork's page links here
    page = viewer.get(reverse("run_detail", args=[fork])).content.decode()
    assert f'href="/runs/compare/?a={demo.ok}&amp;b={fork}"' in page


def test_compare_takes_short_ids_and_says_what_is_wrong_without_a_500(viewer, drive):
    demo = make_demo_runs(drive)
    same = viewer.get(reverse("run_compare"), {"a": demo.ok[:8], "b": demo.ok})
    assert same.status_code == 200 and "The journals agree step for step." in same.content.decode()
    for a, b, message in [("", "", "choose run A"), ("nope", demo.ok, "&#x27;nope&#x27; is not a run id"),
                          (demo.ok, "00000000-0000-0000-0000-000000000000", "run B: no run with id")]:
        resp = viewer.get(reverse("run_compare"), {"a": a, "b": b})
        assert resp.status_code == 200 and message in resp.content.decode(), message
    assert Run.objects.count() == 6


def test_a_long_pair_opens_at_its_divergence_shows_a_window_and_pages_through_it(viewer, django_assert_max_num_queries):
    from journal.models import SessionEvent
    from tests.long_journal import seed_long_run

    a, b = seed_long_run(3000), seed_long_run(3000)
    changed = SessionEvent.objects.get(run_id=b, position=2500)
    with_edit = SessionEvent.objects.filter(run_id=b, position=2500)
    assert with_edit.count() == 1
    # a later record at the same position supersedes it (the log stays append-only)
    SessionEvent.objects.create(run_id=b, seq=SessionEvent.objects.filter(run_id=b).count() + 1,
                                kind=changed.kind, position=2500, step_name=changed.step_name,
                                payload={"result": {"words": -1}})
    with django_assert_max_num_queries(30):
        body = viewer.get(reverse("run_compare"), {"a": a, "b": b}).content.decode()
    assert "First divergence at step 2,500." in body or "First divergence at step 2500." in body
    assert 'id="first-difference"' in body and "Steps 2,490–2,589 of 3,000 (1 differ)" in body
    assert body.count('<tr class="same') + body.count('<tr class="differs') == 100
    later = viewer.get(reverse("run_compare"), {"a": a, "b": b, "from": 2590}).content.decode()
    assert "Steps 2,590–2,689 of 3,000" in later and 'id="first-difference"' not in later
    last = viewer.get(reverse("run_compare"), {"a": a, "b": b, "from": 99999}).content.decode()
    assert "Steps 2,901–3,000 of 3,000" in last
    bad = viewer.get(reverse("run_compare"), {"a": a, "b": b, "from": "x"})
    assert bad.status_code == 200 and "is not a step number" in bad.content.decode()


@pytest.mark.parametrize("mine, theirs, same", [
    ({"args_hash": "h", "result": 5, "duration_ms": 1}, {"args_hash": "h", "result": 5, "duration_ms": 9}, True),
    ({"args_hash": "h", "result": {"a": 1, "b": [2]}}, {"args_hash": "h", "result": {"b": [2], "a": 1}}, True),
    ({"args_hash": "h", "result": 5}, {"args_hash": "h", "result": "5"}, False),  # the text agrees, the JSON not
    ({"args_hash": "h", "result": None}, {"args_hash": "h"}, True),
    ({"args_hash": "h", "result": 1}, {"args_hash": "g", "result": 1}, False),
    ({"args_hash": "h", "result": {"a": [1, {"b": 2}]}}, {"args_hash": "h", "result": {"a": [1, {"b": 3}]}}, False),
    ({"args_hash": "h", "error": {"type": "E", "message": "x"}},
     {"args_hash": "h", "error": {"type": "E", "message": "y"}, "attempt": 2}, True),  # an error is its args
    ({"args_hash": "h", "error": {"type": "E"}}, {"args_hash": "h", "result": None}, False),
])
def test_compare_tells_a_changed_step_from_a_slower_one_by_its_request_and_result(mine, theirs, same):
    from journal.models import EventKind, SessionEvent
    from journal.operations.whatif import compare_runs

    runs = []
    for payload in (mine, theirs):
        run = Run.objects.create(agent="cmp", version="1", status="completed")
        SessionEvent.objects.create(run=run, seq=1, kind=EventKind.STEP_COMPLETED, position=1, step_name="s",
                                    payload=payload)
        runs.append(run)
    result = compare_runs(*runs)
    assert result["steps"][0]["same"] is same and result["differing"] == (0 if same else 1)
