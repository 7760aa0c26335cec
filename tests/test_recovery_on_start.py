"""A worker that starts takes over its own host's dead workers' runs at once, not after their leases expire."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

import journal
from journal.driver import recovery
from journal.models import EventKind, Run, RunStatus, SessionEvent, Worker
from tests.agents import crashy  # noqa: F401  (registers the agents)
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.crashy"


def test_a_restarted_worker_resumes_a_killed_workers_run_before_its_lease_would_expire(worker_env, spawn_worker):
    run_id = journal.start("twelve")
    first = spawn_worker(worker_env(AGENTS, CRASHY_KILL_AT="8", DURABLE_LEASE_SECONDS="30"))
    assert first.wait(timeout=60) == -9  # SIGKILLed inside step 8, holding a 30 s lease
    held = Run.objects.get(id=run_id)
    assert held.status == RunStatus.RUNNING and held.lease_owner
    lease_ends = held.lease_expires_at

    second = spawn_worker(worker_env(AGENTS, DURABLE_LEASE_SECONDS="30"))
    run = journal.wait(run_id, timeout=60)
    assert run.status == RunStatus.COMPLETED, run.error
    recovered = SessionEvent.objects.get(run_id=run_id, kind=EventKind.RUN_RECOVERED)
    assert recovered.payload["previous_worker"] == held.lease_owner
    assert recovered.created_at < lease_ends, "the new worker waited out the dead worker's lease"
    assert Worker.objects.get(id=held.lease_owner).stopped_at is not None
    assert second.terminate() == 0, second.log()


def test_a_stopped_but_living_worker_keeps_its_lease(worker_env, spawn_worker):
    """SIGSTOP is not death: the process exists, so only its lease (and fencing) decides."""
    proc = spawn_worker(worker_env(AGENTS, DURABLE_LEASE_SECONDS="30"))
    wait_for(lambda: Worker.objects.filter(pid=proc.proc.pid).exists(), message="worker registered")
    os.kill(proc.proc.pid, signal.SIGSTOP)
    try:
        assert recovery.dead_local_workers(exclude="") == []
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
    proc.kill()
    wait_for(lambda: recovery.dead_local_workers(exclude="") != [], message="the killed worker seen as dead")


def test_a_reused_pid_is_not_taken_for_the_worker_that_registered_it():
    from django.utils import timezone

    me = os.getpid()
    assert recovery.process_alive(me, timezone.now())
    time.sleep(0.01)
    ancient = timezone.now() - timedelta(days=3650)  # registered long before this process started
    assert not recovery.process_alive(me, ancient)
    assert not recovery.process_alive(2**22 + 17, timezone.now())  # no such pid
