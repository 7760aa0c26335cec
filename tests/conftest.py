"""Shared fixtures: real databases, real worker processes, personas."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    on_pg = os.environ.get("DURABLE_TEST_DB") == "postgres" or "postgres" in os.environ.get("DATABASE_URL", "")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL (make test-postgres)")
    skip_slow = pytest.mark.skip(reason="long variant: run with DURABLE_SLOW=1")
    slow = os.environ.get("DURABLE_SLOW") == "1"
    for item in items:
        if "postgres" in item.keywords and not on_pg:
            item.add_marker(skip_pg)
        if "slow" in item.keywords and not slow:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def _isolated_registry():
    """Workflows defined by one test do not leak into the next."""
    from journal.engine import registry

    snap = registry.snapshot()
    yield
    registry.restore(snap)


@pytest.fixture(autouse=True)
def _no_leaked_workers():
    """A worker thread left running by one test would steal the next test's runs: fail where it leaks."""
    yield
    import threading

    def leaked():
        return [t.name for t in threading.enumerate() if t.name.startswith(("durable-", "journal-writer"))]

    wait_for_end = time.monotonic() + 30
    while leaked() and time.monotonic() < wait_for_end:
        time.sleep(0.1)
    assert not leaked(), f"worker threads still running after the test: {leaked()}"


@pytest.fixture(autouse=True)
def _test_dir(tmp_path, monkeypatch):
    """Agents' execution logs go to this test's directory; worker processes get the same one (worker_env)."""
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))


@pytest.fixture(autouse=True)
def _faults_reset(monkeypatch):
    from journal.store import faults

    monkeypatch.delenv("DURABLE_FAULTS", raising=False)
    faults.reload()
    yield
    faults.reload()


def database_url() -> str:
    """The URL of the test database, for worker subprocesses."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    user = s.get("USER") or "postgres"
    auth = f"{user}:{s['PASSWORD']}" if s.get("PASSWORD") else user
    return f"postgres://{auth}@{host}:{port}/{s['NAME']}"


@pytest.fixture
def worker_env(tmp_path):
    """Environment for a worker process that shares this test's database."""

    def make(agent_modules: str, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update({
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "durable_ui.settings",
            "DURABLE_AGENT_MODULES": agent_modules,
            "PYTHONPATH": str(ROOT),
            "DURABLE_LEASE_SECONDS": "2",
            "DURABLE_TEST_DIR": str(tmp_path),
            "PYTHONUNBUFFERED": "1",
        })
        env.update({k: str(v) for k, v in extra.items()})
        return env

    return make


class WorkerProcess:
    """A real `manage.py runworker` process; tests SIGKILL it to crash it."""

    def __init__(self, env: dict, *args: str, log_path: Path | None = None):
        self.log_path = log_path
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworker", "--poll", "0.05", *args],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        if log_path:
            out.close()  # the child has its own descriptor; ours would leak (ResourceWarning is an error)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM; 0 when the worker shut down cleanly. A worker still booting (Django not set up, its
        handler not installed) dies of the signal holding nothing, which is a clean stop too."""
        booted = "concurrency" in self.log()  # the line runworker prints once its handler is installed
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        return 0 if code == -signal.SIGTERM and not booted else code

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.proc.pid} still running after {timeout}s; its log:\n"
                                 f"{self.log()[-3000:]}") from None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


@pytest.fixture
def spawn_worker(tmp_path):
    procs: list[WorkerProcess] = []

    def spawn(env: dict, *args: str) -> WorkerProcess:
        p = WorkerProcess(env, *args, log_path=tmp_path / f"worker-{len(procs)}.log")
        procs.append(p)
        return p

    yield spawn
    for p in procs:
        p.kill()


@pytest.fixture
def drive():
    """Drive runs in this process until nothing is runnable (a real EmbeddedWorker, in threads)."""
    from journal.driver.worker import EmbeddedWorker

    def run(concurrency: int = 2, **kwargs) -> EmbeddedWorker:
        worker = EmbeddedWorker(concurrency=concurrency, poll_interval=0.02, **kwargs)
        worker.run(until_idle=True, max_seconds=120)
        return worker

    return run


def wait_for(predicate, timeout: float = 30, interval: float = 0.05, message: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@pytest.fixture
def personas(db):
    """viewer, operator and admin users in their groups (built by runs.roles when the dashboard exists)."""
    from django.contrib.auth.models import User

    try:
        from runs.roles import ensure_roles
    except ImportError:  # the dashboard is absent: the engine still works
        ensure_roles = None
    if ensure_roles:
        ensure_roles()
    users = {}
    for role in ("viewer", "operator", "admin"):
        user = User.objects.create_user(role, password=f"{role}-pass")
        if ensure_roles:
            from django.contrib.auth.models import Group

            user.groups.add(Group.objects.get(name=role))
        users[role] = user
    return users
