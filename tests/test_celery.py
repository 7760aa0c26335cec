"""The distributed path end to end: real Redis, real `celery -A durable_ui worker` and `beat` processes.

Celery is only the doorbell: the tests check that start and signal enqueue, that beat's sweep
wakes due timers and recovers a run whose Celery worker was SIGKILLed mid-run (its lease
expires; another worker process claims it), and that nothing ran twice. Skipped cleanly when
Redis is unreachable.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from urllib.parse import urlparse

import pytest

import journal
from journal.models import EventKind, RunStatus, SessionEvent, Worker
from tests.agents import waiting
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.waiting"


def _test_redis_url() -> str:
    """A Redis database of the suite's own, on the server REDIS_URL names (tests/services.py may have started
    a throwaway one): 9 for the SQLite suite, 10 for PostgreSQL's, so the two suites can run side by side."""
    if os.environ.get("DURABLE_TEST_REDIS_URL"):
        return os.environ["DURABLE_TEST_REDIS_URL"]
    base = urlparse(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    db = 10 if os.environ.get("DURABLE_TEST_DB") == "postgres" else 9
    return base._replace(path=f"/{db}").geturl()


REDIS_URL = _test_redis_url()


def _redis_up() -> bool:
    url = urlparse(REDIS_URL)
    try:
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379), timeout=1):
            return True
    except OSError:
        return False


pytestmark = [pytestmark, pytest.mark.skipif(not _redis_up(), reason=f"Redis is not reachable at {REDIS_URL}")]


class CeleryProcess:
    def __init__(self, env: dict, args: list[str], log_path):
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "durable_ui", *args], env=env,
                                         cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def celery_env(worker_env, tmp_path, monkeypatch, settings):
    """Env for Celery processes, and this process enqueuing to the same Redis DB."""
    import redis

    from durable_ui.celery import app

    redis.Redis.from_url(REDIS_URL).flushdb()
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    settings.DURABLE_CELERY = True
    # Nothing in the test process has sent a message before (DURABLE_CELERY is off elsewhere), so
    # the producer pool is built on first use, for this URL.
    app.conf.broker_url = REDIS_URL
    yield worker_env(AGENTS, REDIS_URL=REDIS_URL, DURABLE_CELERY="1", DURABLE_SWEEP_SECONDS="1")


@pytest.fixture
def spawn_celery(tmp_path):
    procs: list[CeleryProcess] = []

    def spawn(env: dict, kind: str, name: str = "a") -> CeleryProcess:
        if kind == "beat":
            args = ["beat", "-l", "info", "-s", str(tmp_path / "beat-schedule"), "--pidfile", ""]
        else:
            args = ["worker", "--pool", "threads", "-c", "2", "-l", "info", "-n", f"{name}@%h",
                    "--without-gossip", "--without-mingle", "--without-heartbeat"]
        p = CeleryProcess(env, args, tmp_path / f"celery-{kind}-{name}-{len(procs)}.log")
        procs.append(p)
        return p

    yield spawn
    for p in procs:
        p.kill()


def _logs(procs) -> str:
    return "\n\n".join(p.log()[-4000:] for p in procs)


def test_start_suspend_signal_complete_and_a_timer_on_celery(celery_env, spawn_celery):
    beat = spawn_celery(celery_env, "beat")
    worker = spawn_celery(celery_env, "worker", "a")
    run_id = journal.start("wait-signal")  # enqueued on commit
    sleeper = journal.start("sleeper", 1.0)
    procs = [beat, worker]
    wait_for(lambda: journal.get_run(run_id).status == RunStatus.SUSPENDED, timeout=60,
             message=f"the run to suspend on a Celery worker\n{_logs(procs)}")
    assert journal.get_run(run_id).lease_owner == ""  # suspended: no worker holds it
    journal.signal(run_id, "go", {"via": "celery"}, actor="ops")  # enqueued on commit
    run = journal.wait(run_id, timeout=60)
    assert run.status == RunStatus.COMPLETED, _logs(procs)
    assert run.output == {"payload": {"via": "celery"}}
    timer = journal.wait(sleeper, timeout=60)  # woken by beat's sweep when due
    assert timer.status == RunStatus.COMPLETED, _logs(procs)
    assert Worker.objects.filter(kind="celery").exists()
    assert not Worker.objects.filter(kind="embedded").exists()  # no embedded worker took part
    claimers = set(SessionEvent.objects.filter(run_id=run_id, kind=EventKind.RUN_CLAIMED)
                   .values_list("actor", flat=True))
    assert claimers <= set(Worker.objects.filter(kind="celery").values_list("id", flat=True))
    lines = Counter(waiting.lines())
    assert lines[f"got {run_id}"] == 1 and lines[f"fired {sleeper}"] == 1


def test_a_celery_worker_killed_mid_run_is_recovered_by_another(celery_env, spawn_celery):
    beat = spawn_celery(celery_env, "beat")
    first = spawn_celery(celery_env, "worker", "a")
    run_id = journal.start("slow-steps", 10, 0.4)
    procs = [beat, first]
    wait_for(lambda: SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).count() >= 3,
             timeout=60, message=f"three steps on the first Celery worker\n{_logs(procs)}")
    holder = journal.get_run(run_id).lease_owner
    assert holder and str(first.proc.pid) in holder
    first.kill()  # SIGKILL mid-run: its lease stays on the run until it expires
    assert journal.get_run(run_id).status == RunStatus.RUNNING
    second = spawn_celery(celery_env, "worker", "b")
    procs.append(second)
    run = journal.wait(run_id, timeout=90)
    assert run.status == RunStatus.COMPLETED, _logs(procs)
    assert run.output == sum(range(10))
    recovered = SessionEvent.objects.get(run_id=run_id, kind=EventKind.RUN_RECOVERED)
    assert recovered.payload["previous_worker"] == holder and str(second.proc.pid) in recovered.actor
    counts = Counter(waiting.lines())
    assert all(1 <= counts[f"slow {i}"] <= 2 for i in range(10)), counts
    assert sum(counts[f"slow {i}"] for i in range(10)) <= 11  # at most the step in flight ran twice


def test_a_restarted_celery_worker_takes_the_dead_ones_runs_at_once(celery_env, spawn_celery):
    """No beat (nothing else would ring for the run) and the default 30 s lease: only the new worker
    noticing, at its start, that the old one's process is gone can resume the run, and before the
    lease would have let anyone."""
    env = {**celery_env, "DURABLE_LEASE_SECONDS": "30"}
    first = spawn_celery(env, "worker", "a")
    run_id = journal.start("slow-steps", 6, 0.3)
    wait_for(lambda: SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).count() >= 2,
             timeout=60, message=f"two steps on the first Celery worker\n{first.log()[-3000:]}")
    holder = journal.get_run(run_id).lease_owner
    first.kill()
    second = spawn_celery(env, "worker", "b")
    run = journal.wait(run_id, timeout=20)  # the lease had 20-30 s left: heartbeats renew it every 10 s
    assert run.status == RunStatus.COMPLETED, _logs([first, second])
    recovered = SessionEvent.objects.get(run_id=run_id, kind=EventKind.RUN_RECOVERED)
    assert recovered.payload["previous_worker"] == holder and str(second.proc.pid) in recovered.actor
    assert Worker.objects.get(id=holder).stopped_at is not None
    counts = Counter(waiting.lines())
    assert sum(counts[f"slow {i}"] for i in range(6)) <= 7, counts  # at most the step in flight ran twice


def test_duplicate_and_stale_messages_are_harmless(celery_env, spawn_celery):
    """The lease decides: many messages for one run drive it once; messages for finished runs do nothing."""
    from journal.integrations.tasks import advance_run

    worker = spawn_celery(celery_env, "worker", "a")
    run_id = journal.start("slow-steps", 3, 0.2)
    for _ in range(10):
        advance_run.delay(run_id)
    run = journal.wait(run_id, timeout=60)
    assert run.status == RunStatus.COMPLETED, worker.log()
    for _ in range(5):
        advance_run.delay(run_id)
    advance_run.delay("00000000-0000-0000-0000-000000000000")
    wait_for(lambda: worker.log().count("advance_run") >= 16 or worker.log().count("succeeded") >= 16,
             timeout=30, message=f"the extra messages to be consumed\n{worker.log()[-3000:]}")
    assert Counter(waiting.lines()) == Counter({f"slow {i}": 1 for i in range(3)})
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.RUN_COMPLETED).count() == 1
