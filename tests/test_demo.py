"""`manage.py demo --no-serve` seeds a database the dashboard can show in every run state."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from io import StringIO

import pytest
from django.core.management import call_command

from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox_root():
    # sandboxed commands run as an unprivileged user: the root must be reachable by it (pytest's tmp is 0700)
    root = tempfile.mkdtemp(prefix="agents-demo-sandboxes-")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_demo_seeding_reaches_every_run_state_and_prints_the_logins(monkeypatch, tmp_path, settings, sandbox_root):
    from django.contrib.auth import authenticate

    from journal.models import Run, SideEffect

    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path / "outbox"))
    settings.DURABLE_SANDBOX_ROOT = sandbox_root
    out = StringIO()
    call_command("demo", "--no-serve", "--contracts", "120", stdout=out)
    text = out.getvalue()
    for user, password in (("viewer", "viewer-demo"), ("operator", "operator-demo"), ("admin", "admin-demo")):
        assert f"{user:9s} / {password}" in text
        assert authenticate(username=user, password=password) is not None

    statuses = set(Run.objects.values_list("status", flat=True))
    assert {"completed", "suspended", "failed", "compensated", "needs_attention"} <= statuses, statuses
    assert Run.objects.waiting_for_approval().filter(agent="contract_review").exists()
    failed = Run.objects.get(status="failed")
    assert "unreadable scan" in failed.error and failed.steps > 10  # something to step through and fork
    attention = Run.objects.get(status="needs_attention")
    assert attention.attempts == 2 and "outcome was never recorded" in attention.attention_reason
    assert SideEffect.objects.get(run=attention).status == "started"
    assert attention.tokens > 0  # counted with each recorded call, so the crashed worker's calls are not lost
    forked = Run.objects.get(forked_from__isnull=False)
    assert forked.status == "completed" and forked.input["llm_override"]["model"] == "scripted-large"
    assert Run.objects.filter(agent="code_repair", status="completed", output__green=True).exists()
    assert Run.objects.filter(tokens__gt=0).count() >= 5 and sum(r.cost for r in Run.objects.all()) > 0

    # the long run was left part-way; a worker (as `manage.py demo` starts one) shows it running
    long_run = Run.objects.get(input__kwargs__size=120)
    assert long_run.status == "pending" and 0 < long_run.progress["done"] < 120
    from journal.driver.worker import EmbeddedWorker

    worker = EmbeddedWorker(concurrency=1, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"max_seconds": 30}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: Run.objects.get(id=long_run.id).status == "running", timeout=20, message="running")
        done = Run.objects.get(id=long_run.id).progress["done"]
        wait_for(lambda: Run.objects.get(id=long_run.id).progress["done"] > done, timeout=20,
                 message="progress while running")
    finally:
        worker.request_stop()
        thread.join(timeout=60)
