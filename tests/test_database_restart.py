"""PostgreSQL restarts under load: real `runworker` processes, a real cluster, `pg_ctl restart -m immediate`.

The test starts a THROWAWAY cluster of its own (initdb into a temporary directory, a free port, its
socket in that directory; `runuser -u postgres` when root) so that restarting it touches nobody's
server, migrates it, starts ~20 runs of crashy's `twelve` (twelve slow steps, three effects) on two
worker processes, restarts the cluster three times ten seconds apart and waits. Then: both workers are
still alive, every run is `completed` or `needs_attention` (an effect genuinely in doubt: it started,
its result never committed), none `failed`, every session log is 1..N without a gap, and no effect
executed twice (crashy logs each execution before doing it).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres
AGENTS = "tests.agents.crashy"
TERMINAL = {"completed", "needs_attention", "failed", "cancelled", "compensated"}


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        pytest.skip("no PostgreSQL binaries in /usr/lib/postgresql/*/bin")
    return os.path.dirname(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A PostgreSQL cluster in a temporary directory, owned by this test alone."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="durable-pg-restart-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/durable_restart"

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([*self.run_as, f"{self.bindir}/pg_ctl", "-D", str(self.data), "-l", str(self.dir / "pg.log"),
                        "-w", "-t", str(int(timeout)), *args], check=True, timeout=timeout + 10,
                       stdout=subprocess.DEVNULL)

    def start(self) -> None:
        subprocess.run([*self.run_as, f"{self.bindir}/initdb", "-D", str(self.data), "-U", "postgres",
                        "--auth=trust", "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL)
        self._ctl("-o", self.options, "start")
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE durable_restart")

    def restart(self, down_for: float = 0) -> None:
        """What an operator's `pg_ctl restart -m immediate` does: every backend dies, crash recovery, back.
        ``down_for`` keeps the server stopped that long in between (an outage longer than a lease)."""
        if not down_for:
            self._ctl("-m", "immediate", "-o", self.options, "restart")
            return
        self._ctl("-m", "immediate", "stop")
        time.sleep(down_for)
        self._ctl("-o", self.options, "start")

    def destroy(self) -> None:
        try:
            self._ctl("-m", "immediate", "stop", timeout=30)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Read the cluster from the test (a fresh connection: the server may have just restarted)."""
        end = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=5) as conn:
                    return conn.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.destroy()


def _manage(env: dict, *args: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, check=True,
                          capture_output=True, text=True, timeout=300).stdout


START_RUNS = """
import django
django.setup()
import journal
from tests.agents import crashy  # noqa: F401
for _ in range({n}):
    print(journal.start("twelve", 12, 4))
"""


def _progress(cluster: Cluster) -> int:
    return cluster.query("SELECT count(*) FROM journal_sessionevent")[0][0]


def _restarts_under_load(cluster, worker_env, spawn_worker, tmp_path, *, runs: int, restarts: int, apart: float,
                         step_sleep: float, lease: int, down_for: float = 0, retry_seconds: float = 30) -> dict:
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP=str(step_sleep), DURABLE_LEASE_SECONDS=str(lease),
                     DURABLE_DB_RETRY_SECONDS=str(retry_seconds))
    env["DATABASE_URL"] = cluster.url
    env.pop("DURABLE_CELERY", None)
    _manage(env, "migrate", "--verbosity", "0")
    workers = [spawn_worker(env, "--concurrency", "4") for _ in range(2)]
    out = subprocess.run([sys.executable, "-c", START_RUNS.format(n=runs)], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    run_ids = out.split()
    assert len(run_ids) == runs

    time.sleep(3)  # runs in flight on both workers
    recoveries = []
    for i in range(restarts):
        if i:
            time.sleep(apart)
        before = _progress(cluster)
        cluster.restart(down_for)
        back = time.monotonic()
        while _progress(cluster) <= before:  # the first journal entry written after the database is back
            assert time.monotonic() - back < 60, "no run made progress within 60 s of the restart"
            time.sleep(0.1)
        recoveries.append(round(time.monotonic() - back, 2))

    end = time.monotonic() + 180
    while time.monotonic() < end:
        statuses = dict(cluster.query("SELECT status, count(*) FROM journal_run GROUP BY status"))
        if sum(n for s, n in statuses.items() if s in TERMINAL) == runs:
            break
        time.sleep(0.5)
    statuses = dict(cluster.query("SELECT status, count(*) FROM journal_run GROUP BY status"))
    logs = [w.log() for w in workers]
    alive = [w.alive for w in workers]
    failed = cluster.query("SELECT id, error FROM journal_run WHERE status = 'failed'")

    seqs = cluster.query("SELECT run_id, array_agg(seq ORDER BY seq) FROM journal_sessionevent GROUP BY run_id")
    gaps = {str(r): s for r, s in seqs if s != list(range(1, len(s) + 1))}
    effects = Counter(line for line in (tmp_path / "executions.log").read_text().splitlines()
                      if line.startswith("effect"))
    twice = {k: n for k, n in effects.items() if n > 1}
    in_doubt = cluster.query("SELECT count(*) FROM journal_sideeffect e JOIN journal_run r ON r.id = e.run_id "
                             "WHERE e.status = 'started' AND r.status = 'needs_attention'")[0][0]
    outage_lines = [len(re.findall(r"worker \S+: the database is unavailable", log)) for log in logs]
    downtimes = [float(x) for log in logs for x in re.findall(r"answers again \(unavailable for ([\d.]+)s\)", log)]
    report = {"runs": runs, "restarts": restarts, "down_for": down_for, "lease": lease, "statuses": statuses,
              "workers_alive": alive,
              "gaps": len(gaps), "effects_executed": sum(effects.values()), "effects_twice": len(twice),
              "effects_in_doubt": in_doubt, "outage_log_lines": outage_lines,
              "seconds_to_first_progress_after_restart": recoveries,
              "worker_downtime_seconds": downtimes,
              "given_back": sum(len(re.findall(r"run \S+ given back, not failed", log)) for log in logs),
              "writes_retried": sum(log.count("retrying a journal write") for log in logs),
              "recovered": cluster.query(
                  "SELECT count(*) FROM journal_sessionevent WHERE kind = 'run_recovered'")[0][0]}
    print("\nDATABASE RESTART REPORT " + json.dumps(report, sort_keys=True))
    (tmp_path / "restart-report.json").write_text(json.dumps(report, indent=2, sort_keys=True))

    tail = "\n".join(f"--- worker {i} ---\n{log[-4000:]}" for i, log in enumerate(logs))
    assert all(alive), f"a worker process exited: {report}\n{tail}"
    assert not failed, f"runs failed: {failed[:3]}\n{tail}"
    assert set(statuses) <= {"completed", "needs_attention"}, f"{report}\n{tail}"
    assert sum(statuses.values()) == runs
    assert statuses.get("needs_attention", 0) == in_doubt, "every needs_attention run is an effect in doubt"
    assert not gaps, f"session logs with gaps: {list(gaps.items())[:3]}"
    assert not twice, f"effects executed twice: {twice}"
    assert len(seqs) == runs
    # Said once per outage, not per poll (a worker whose every slot was busy may not notice at all: its
    # writers' retries rode the outage out).
    assert all(n <= 2 * restarts for n in outage_lines) and sum(outage_lines) >= 1, f"per poll? {report}"
    return report


def test_three_immediate_restarts_under_twenty_runs_on_two_workers(cluster, worker_env, spawn_worker, tmp_path):
    _restarts_under_load(cluster, worker_env, spawn_worker, tmp_path, runs=20, restarts=3, apart=10,
                         step_sleep=0.8, lease=5)


@pytest.mark.slow
def test_many_immediate_restarts_under_sixty_runs(cluster, worker_env, spawn_worker, tmp_path):
    _restarts_under_load(cluster, worker_env, spawn_worker, tmp_path, runs=60, restarts=8, apart=6,
                         step_sleep=0.6, lease=2)


@pytest.mark.slow
def test_outages_longer_than_the_leases_and_the_retries(cluster, worker_env, spawn_worker, tmp_path):
    """Down 5 s with 2 s leases and 2 s of write retries: writers give their runs back, leases run out
    mid-outage, both workers race for the runs when it returns, and the epoch decides who continues."""
    report = _restarts_under_load(cluster, worker_env, spawn_worker, tmp_path, runs=30, restarts=4, apart=6,
                                  step_sleep=0.6, lease=2, down_for=5, retry_seconds=2)
    assert report["given_back"] > 0  # the give-back path really ran
