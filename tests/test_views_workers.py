"""Harness & workers page, the overview charts (and their pure figure builders), the audit log page."""

from __future__ import annotations

from datetime import date

import pytest
from django.urls import reverse
from django.utils import timezone

from journal.models import Worker
from runs import charts
from runs.models import AuditEntry
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo(drive):
    return make_demo_runs(drive)


def login(client, personas, role="viewer"):
    client.force_login(personas[role])
    return client


def test_workers_page_lists_agents_versions_and_live_workers_with_their_runs(client, personas, demo):
    from journal.models import Run

    Worker.objects.create(id="host:1:abc", hostname="host", pid=1, heartbeat_at=timezone.now())
    Run.objects.filter(id=demo.waiting).update(lease_owner="host:1:abc")
    body = login(client, personas).get(reverse("workers")).content.decode()
    assert "dash_ok" in body and "dash_review" in body and "host:1:abc" in body
    assert demo.waiting[:8] in body.split("host:1:abc")[1]
    assert "completed 1" in body  # runs by status per agent version


def test_a_dead_worker_is_not_listed_among_live_workers(client, personas, db):
    import os
    import socket
    import subprocess
    import sys
    from datetime import timedelta

    from journal.models.run import lease_seconds

    here, now = socket.gethostname(), timezone.now()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # that process has exited: its pid names no one (or someone started later)
    Worker.objects.create(id="alive-here", hostname=here, pid=os.getpid(), started_at=now, heartbeat_at=now)
    Worker.objects.create(id="pid-gone", hostname=here, pid=dead_pid, started_at=now - timedelta(minutes=5),
                          heartbeat_at=now - timedelta(seconds=20))
    Worker.objects.create(id="silent-elsewhere", hostname="other-host", pid=7, started_at=now - timedelta(hours=1),
                          heartbeat_at=now - timedelta(seconds=3 * lease_seconds() + 5))
    Worker.objects.create(id="alive-elsewhere", hostname="other-host", pid=8, heartbeat_at=now)
    body = login(client, personas).get(reverse("workers")).content.decode()
    live = body.split("Recently stopped or silent workers")[0]
    assert "alive-here" in live and "alive-elsewhere" in live
    assert "pid-gone" not in live and "silent-elsewhere" not in live
    assert "pid-gone" in body and "silent-elsewhere" in body  # listed as stopped or silent instead


def test_workers_page_empty_state(client, personas, db):
    body = login(client, personas).get(reverse("workers")).content.decode()
    assert "python manage.py runworker" in body


def test_pause_agent_from_the_workers_page_is_audited(client, personas, demo):
    resp = login(client, personas, "operator").post(reverse("agent_act", args=["dash_approval"]),
                                                    {"action": "pause_agent", "reason": "bad deploy"}, follow=True)
    assert resp.status_code == 200
    entry = AuditEntry.objects.get(action="pause_agent")
    assert entry.target == "agent dash_approval" and entry.comment == "bad deploy"
    assert entry.result == "dash_approval: 1 run(s) paused" and entry.result in resp.content.decode()
    from journal.models import Run

    assert Run.objects.get(id=demo.waiting).paused
    assert "1 paused" in resp.content.decode()


def test_workers_page_query_count_is_flat(client, personas, drive):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import journal

    c = login(client, personas)
    counts = []
    for n in (1, 5):
        for i in range(n):
            journal.start("dash_ok", f"w-{n}-{i}")
            Worker.objects.create(id=f"h:{n}:{i}", hostname="h", pid=i, heartbeat_at=timezone.now())
        drive()
        with CaptureQueriesContext(connection) as ctx:
            c.get(reverse("workers"))
        counts.append(len(ctx))
    assert counts[0] == counts[1], counts


def test_overview_renders_charts_from_json_script(client, personas, demo, django_assert_max_num_queries):
    c = login(client, personas)
    with django_assert_max_num_queries(12):
        body = c.get(reverse("overview")).content.decode()
    for fig in ("fig-status", "fig-duration", "fig-failures", "fig-cost"):
        assert f'id="{fig}" type="application/json"' in body
    assert "need attention" in body


def test_overview_empty_state(client, personas, db):
    assert "Charts appear once runs start" in login(client, personas).get(reverse("overview")).content.decode()


def test_chart_builders_are_pure_and_correct():
    rows = [(date(2026, 1, 1), "completed", 3), (date(2026, 1, 1), "failed", 1), (date(2026, 1, 2), "failed", 2)]
    fig = charts.runs_by_status(rows)
    bars = {t["name"]: t["y"] for t in fig["data"]}
    assert bars == {"completed": [3, 0], "failed": [1, 2]} and fig["layout"]["barmode"] == "stack"
    rate = charts.failure_rate(rows)["data"][0]
    assert rate["x"] == ["2026-01-01", "2026-01-02"] and rate["y"] == [25.0, 100.0]
    dur = charts.duration_percentiles([("2026-01-01", s) for s in range(1, 101)])
    assert dur["data"][0]["y"] == [50.5] and dur["data"][1]["y"] == [95.05]
    cost = charts.cost_per_day([("2026-01-01", 0.5, 10), ("2026-01-01", 0.25, 5)])
    assert cost["data"][0]["y"] == [0.75] and cost["data"][1]["y"] == [15]
    assert cost["layout"]["yaxis2"]["rangemode"] == "tozero"  # one day's 91,271 tokens: an axis from 0, not 91.27k…
    assert charts.runs_by_status([])["data"] == []


def test_the_waterfall_has_one_bar_per_span_coloured_by_kind():
    start = timezone.now()
    fig = charts.waterfall([{"name": "a", "kind": "step", "position": 1, "started_at": start, "duration_ms": 5,
                         "status": "ok"},
                        {"name": "b", "kind": "model", "position": 2, "started_at": start, "duration_ms": 0,
                         "status": "error"}])
    assert {t["name"] for t in fig["data"]} == {"step", "model"}
    model = next(t for t in fig["data"] if t["name"] == "model")
    assert model["x"] == [0.5] and model["marker"]["color"] == ["#d64545"]


def test_audit_log_lists_who_what_when_run_and_comment(client, personas, demo):
    c = login(client, personas, "operator")
    c.post(reverse("run_act", args=[demo.waiting, "cancel"]), {"reason": "duplicate order"})
    body = c.get(reverse("audit")).content.decode()
    assert "operator" in body and "cancel" in body and "duplicate order" in body and demo.waiting[:8] in body
    filtered = c.get(reverse("audit"), {"actor": "someone-else"}).content.decode()
    assert "duplicate order" not in filtered and "No actions recorded" in filtered
    assert "is not a run id" in c.get(reverse("audit"), {"run": "zzz"}, follow=True).content.decode()


def test_audit_log_names_actions_as_people_read_them(client, personas, demo):
    c = login(client, personas, "operator")
    c.post(reverse("approval_decide"), {"run_id": demo.waiting, "decision": "accept", "comment": "ok"})
    c.post(reverse("run_act", args=[demo.failed, "rerun"]), {"at_step": "3"})
    body = c.get(reverse("audit")).content.decode()
    assert ">approval: accepted</td>" in body and ">re-run from a step</td>" in body
    assert ">approval_accept<" not in body


def test_audit_log_pages_without_offset(client, personas, db):
    for i in range(130):
        AuditEntry.objects.create(actor="operator", action="pause", comment=f"c{i}")
    c = login(client, personas, "admin")
    first = c.get(reverse("audit")).content.decode()
    assert "c129" in first and "c29<" not in first and "before=" in first
    before = first.split("before=")[1].split('"')[0]
    second = c.get(reverse("audit"), {"before": before}).content.decode()
    assert "c29<" in second and "c129" not in second


def test_favicon_is_not_a_404(client, db):
    resp = client.get("/favicon.ico")
    assert resp.status_code == 301 and resp["Location"].endswith(".svg")
    from django.contrib.staticfiles import finders

    assert finders.find("favicon.svg")
