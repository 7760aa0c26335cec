"""Bulk actions on a whole search in the background: the count first, then a job with live progress
that reaches the end, each run's action audited, runs whose state refuses the action counted and listed;
a job whose thread died (a web restart) carries on from its cursor when its page is next looked at."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

import journal
from journal.models import Run, RunStatus
from runs.bulk import create_job
from runs.models import AuditEntry, BulkJob, BulkJobStatus
from tests.conftest import wait_for
from tests.dashboard_data import make_demo_runs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def many(drive, settings):
    settings.DASHBOARD_BULK_INLINE_MAX = 3
    demo = make_demo_runs(drive)
    failed = [journal.start("dash_fail", f"f{i}.csv") for i in range(8)]
    completed = [journal.start("dash_ok", f"ok{i}.txt") for i in range(3)]
    drive(concurrency=4)
    return demo, [demo.failed, *failed], [demo.ok, *completed]


def _progress(client, job_id) -> tuple[int, str]:
    resp = client.get(reverse("bulk_job", args=[job_id]), HTTP_HX_REQUEST="true")
    assert resp.status_code in (200, 286)
    return resp.status_code, resp.content.decode()


def test_a_bulk_retry_on_a_search_runs_in_the_background_to_the_end(client, personas, many):
    demo, failed, completed = many
    client.force_login(personas["operator"])
    search = {"scope": "filter", "action": "retry", "status": ["failed", "completed"], "q": "agent:dash_fail",
              "next": "/"}
    dry = client.post(reverse("run_bulk"), {**search, "dry_run": "1"}).json()
    assert dry["count"] == len(failed) and not AuditEntry.objects.exists()  # the count first, nothing done

    everything = {**search, "q": "step:fetch_doc"}  # failed and completed runs both ran fetch_doc
    count = client.post(reverse("run_bulk"), {**everything, "dry_run": "1"}).json()["count"]
    assert count == len(failed) + len(completed)
    resp = client.post(reverse("run_bulk"), everything)
    job = BulkJob.objects.get()
    assert resp.status_code == 302 and resp["Location"] == reverse("bulk_job", args=[job.id])
    assert job.total == count

    page = client.get(resp["Location"]).content.decode()
    assert 'id="bulk-progress"' in page and 'hx-trigger="every 1s"' in page
    wait_for(lambda: _progress(client, job.id)[0] == 286, timeout=60, message="the job to finish")
    job.refresh_from_db()
    assert job.status == BulkJobStatus.FINISHED and job.percent == 100
    assert (job.done, job.refused, job.failed) == (len(failed), len(completed), 0)
    assert job.refused_by_reason == {"completed": len(completed)}
    assert {run_id for run_id, _ in job.refusals} == set(completed)
    assert set(Run.objects.filter(id__in=failed).values_list("status", flat=True)) <= {
        RunStatus.PENDING, RunStatus.RUNNING, RunStatus.FAILED}
    assert all(e.status == RunStatus.PENDING for e in Run.objects.filter(id__in=failed))
    audited = AuditEntry.objects.filter(action="retry", target=f"bulk job {job.id}")
    assert audited.count() == len(failed) and all(e.ok and e.actor == "operator" for e in audited)

    status, fragment = _progress(client, job.id)
    assert status == 286 and "hx-trigger" not in fragment  # the poll stops at the end
    counts = re.sub(r"\s+", " ", fragment.split('id="bulk-counts">')[1].split("</p>")[0])
    assert f"<strong>{count}</strong> of {count} runs" in counts
    assert f"{len(failed)} retry done" in counts and f"{len(completed)} refused by their state" in counts
    for run_id in completed:
        assert f'href="/runs/{run_id}/"' in fragment  # the refused runs are listed, not shown as errors
    assert 'class="msg error"' not in fragment


def test_a_small_search_is_still_acted_on_at_once(client, personas, many, settings):
    demo, failed, completed = many
    settings.DASHBOARD_BULK_INLINE_MAX = 20
    client.force_login(personas["operator"])
    resp = client.post(reverse("run_bulk"), {"scope": "filter", "action": "pause", "q": "agent:dash_fail",
                                             "next": "/"})
    assert resp.status_code == 302 and resp["Location"] == "/" and not BulkJob.objects.exists()


def test_a_job_whose_thread_died_carries_on_when_its_page_is_looked_at(client, personas, many):
    demo, failed, completed = many
    client.force_login(personas["operator"])
    job = create_job(actor="operator", action="cancel", reason="restart test", params={"q": ["agent:dash_fail"]},
                     total=len(failed), start=False)  # as a web restart leaves it: queued, no thread
    assert BulkJob.objects.get(id=job.id).processed == 0
    wait_for(lambda: _progress(client, job.id)[0] == 286, timeout=60, message="the job to finish")
    job.refresh_from_db()
    assert job.status == BulkJobStatus.FINISHED
    assert (job.done, job.refused) == (0, len(failed))  # failed runs cannot be cancelled: all refused
    assert job.refused_by_reason == {"failed": len(failed)}


def test_the_job_page_needs_a_viewer_and_an_unknown_job_is_a_404(client, personas):
    import uuid

    assert client.get(reverse("bulk_job", args=[uuid.uuid4()])).status_code in (302, 403)
    client.force_login(personas["viewer"])
    assert client.get(reverse("bulk_job", args=[uuid.uuid4()])).status_code == 404


def test_a_database_outage_pauses_a_job_and_the_next_look_finishes_it_without_acting_twice(personas, many,
                                                                                         monkeypatch):
    from django.db import OperationalError

    from runs import bulk

    demo, failed, completed = many
    monkeypatch.setattr(bulk, "SAVE_EVERY", 2)
    job = create_job(actor="operator", action="retry", reason="outage test", params={"q": ["agent:dash_fail"]},
                     total=len(failed), start=False)
    real, calls = bulk.call, []

    def flaky(action, run_id, actor, reason):
        calls.append(run_id)
        if len(calls) == 4:  # the database goes away in the middle of the job
            raise OperationalError("server closed the connection unexpectedly")
        return real(action, run_id, actor, reason)

    monkeypatch.setattr(bulk, "call", flaky)
    BulkJob.objects.filter(id=job.id).update(owner="t1", status=BulkJobStatus.RUNNING)
    bulk._work(job.id, "t1")
    job.refresh_from_db()
    assert job.status == BulkJobStatus.RUNNING and job.done == 2  # not broken: saved up to its last save

    BulkJob.objects.filter(id=job.id).update(heartbeat=None)  # as seen once its heartbeat is stale
    monkeypatch.setattr(bulk, "call", real)
    assert BulkJob.objects.filter(id=job.id).update(owner="t2") == 1
    bulk._work(job.id, "t2")
    job.refresh_from_db()
    assert job.status == BulkJobStatus.FINISHED
    # The third run was retried before the outage but after the last save: the second pass finds it
    # pending, so it is refused, not retried again.
    assert (job.done, job.refused, job.failed) == (len(failed) - 1, 1, 0)
    assert AuditEntry.objects.filter(action="retry", target=f"bulk job {job.id}").count() == len(failed)
