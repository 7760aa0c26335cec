"""Suspended runs hold no thread: 500 runs waiting on one in-process worker leave its thread count flat.

(The 10,000-run version with memory figures is bench/suspended_runs.py.)
"""

import threading

import psutil
import pytest

import journal
from journal.driver.worker import EmbeddedWorker
from journal.models import Run, RunStatus
from tests.agents import waiting  # noqa: F401  (registers the agents)
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
N = 500
CONCURRENCY = 4


def _threads() -> int:
    return psutil.Process().num_threads()


def test_500_suspended_runs_on_one_worker_hold_no_threads():
    run_ids = [journal.start("wait-signal") for _ in range(N)]
    worker = EmbeddedWorker(concurrency=CONCURRENCY, poll_interval=0.02)
    loop = threading.Thread(target=worker.run, name="test-worker-loop", daemon=True)
    baseline = _threads()
    loop.start()
    try:
        wait_for(lambda: Run.objects.filter(status=RunStatus.SUSPENDED).count() == N, timeout=240,
                 interval=0.2, message=f"{N} runs to suspend")
        # The worker's threads: its loop, a heartbeat, the doorbell's listener (PostgreSQL), at most
        # CONCURRENCY pool threads. Not one per run.
        suspended_threads = _threads()
        assert suspended_threads - baseline <= CONCURRENCY + 3, (baseline, suspended_threads)
        assert not worker._active and Run.objects.filter(lease_owner=worker.id).count() == 0

        for run_id in run_ids:
            journal.signal(run_id, "go", 1)
        wait_for(lambda: Run.objects.filter(status=RunStatus.COMPLETED).count() == N, timeout=240,
                 interval=0.2, message=f"{N} runs to complete")
        assert _threads() - baseline <= CONCURRENCY + 3
    finally:
        worker.request_stop()
        loop.join(timeout=60)
    assert not loop.is_alive()
    assert worker.completed >= 2 * N  # each run was driven to a stop twice: suspension, completion
