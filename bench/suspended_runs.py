"""10,000 runs suspended on signals, one worker process: memory, threads, and the time to resume them all.

    .venv/bin/python bench/suspended_runs.py [--runs 10000] [--concurrency 4]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_bench_suspend .venv/bin/python bench/suspended_runs.py

What it does, against a throwaway database (SQLite file unless DATABASE_URL is given):

1. starts ONE real ``manage.py runworker`` process and records its RSS and thread count idle;
2. creates ``--runs`` runs of the ``wait-signal`` agent (tests/agents/waiting.py) with
   ``journal.start`` and waits until every one is suspended; the worker's RSS and threads are
   sampled throughout (peak) and when all are suspended. A warm sample is taken after the first
   5% suspend, so "flat" compares like with like (imports and caches are loaded by then);
3. sends one ``journal.signal`` per run from this process and times until all are completed.

A suspended run is a row with ``waiting_for``; no thread or stack waits for it, so the worker's
memory should not grow with the number of suspended runs. Results go to
bench/results/suspended_runs-<db>.json and a markdown line to bench/results/suspended_runs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
if not os.environ.get("DATABASE_URL"):
    db_file = Path(tempfile.gettempdir()) / "bench-suspended.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_file}{suffix}").unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{db_file}"
os.environ["DURABLE_AGENT_MODULES"] = "tests.agents.waiting"
os.environ.setdefault("DURABLE_TEST_DIR", tempfile.mkdtemp(prefix="bench-suspended-"))

import django  # noqa: E402

django.setup()

import psutil  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import journal  # noqa: E402
import tests.agents.waiting  # noqa: E402, F401
from journal.models import Run, RunStatus  # noqa: E402

AGENT = "wait-signal"
RESULTS = ROOT / "bench" / "results"


def fresh_database() -> None:
    if connection.vendor == "postgresql":
        name = connection.settings_dict["NAME"]
        connection.close()
        import psycopg

        s = connection.settings_dict
        admin = psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"] or "postgres",
                                password=s["PASSWORD"] or None, dbname="postgres", autocommit=True)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.close()
    call_command("migrate", verbosity=0)


class Sampler(threading.Thread):
    """Samples the worker process's RSS and thread count every 0.2 s (for the peak)."""

    def __init__(self, proc: psutil.Process):
        super().__init__(daemon=True)
        self.proc = proc
        self.peak_rss = 0
        self.peak_threads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
                self.peak_threads = max(self.peak_threads, self.proc.num_threads())
            except psutil.NoSuchProcess:
                return
            self.stop.wait(0.2)


def sample(proc: psutil.Process) -> dict:
    return {"rss_mb": round(proc.memory_info().rss / 2**20, 1), "threads": proc.num_threads()}


def count(status: str) -> int:
    return Run.objects.filter(status=status).count()


def wait_until(predicate, timeout: float, what: str) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args()
    fresh_database()
    db = connection.vendor
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = open(RESULTS.parent / f".suspended-worker-{db}.log", "wb")  # noqa: SIM115 - the child keeps it
    worker = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runworker", "--concurrency",
                               str(args.concurrency), "--poll", "0.05"], env=env, cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT)
    log.close()
    proc = psutil.Process(worker.pid)
    try:
        time.sleep(3)  # Django set up, first polls done
        idle = sample(proc)
        sampler = Sampler(proc)
        sampler.start()

        t0 = time.perf_counter()
        run_ids = []
        warm = None
        warm_at = max(1, args.runs // 20)
        for i in range(args.runs):
            run_ids.append(journal.start(AGENT))
            if warm is None and i + 1 == warm_at:
                wait_until(lambda: count(RunStatus.SUSPENDED) >= warm_at, args.timeout, "warm-up suspensions")
                warm = sample(proc)
        start_seconds = time.perf_counter() - t0
        wait_until(lambda: count(RunStatus.SUSPENDED) == args.runs, args.timeout, "all runs to suspend")
        suspend_seconds = time.perf_counter() - t0
        time.sleep(1)
        suspended = sample(proc)
        leased = Run.objects.exclude(lease_owner="").count()

        t1 = time.perf_counter()
        for run_id in run_ids:
            journal.signal(run_id, "go", {"n": 1}, actor="bench")
        signal_seconds = time.perf_counter() - t1
        wait_until(lambda: count(RunStatus.COMPLETED) == args.runs, args.timeout, "all runs to complete")
        resume_seconds = time.perf_counter() - t1
        done = sample(proc)
        sampler.stop.set()
        sampler.join()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()

    result = {
        "database": db,
        "runs": args.runs,
        "worker_concurrency": args.concurrency,
        "worker_idle": idle,
        "worker_warm_after_5pct_suspended": warm,
        "worker_all_suspended": suspended,
        "worker_all_completed": done,
        "worker_peak": {"rss_mb": round(sampler.peak_rss / 2**20, 1), "threads": sampler.peak_threads},
        "rss_growth_warm_to_all_suspended_mb": round(suspended["rss_mb"] - warm["rss_mb"], 1),
        "runs_leased_while_all_suspended": leased,
        "seconds_to_start_all": round(start_seconds, 1),
        "seconds_until_all_suspended": round(suspend_seconds, 1),
        "seconds_to_send_all_signals": round(signal_seconds, 1),
        "seconds_from_first_signal_to_all_completed": round(resume_seconds, 1),
        "resumed_per_second": round(args.runs / resume_seconds, 1),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"suspended_runs-{db}.json").write_text(json.dumps(result, indent=2) + "\n")
    line = (f"| {db} | {args.runs:,} | {idle['rss_mb']} | {warm['rss_mb']} | {suspended['rss_mb']} | "
            f"{done['rss_mb']} | {sampler.peak_threads} | {leased} | {result['seconds_until_all_suspended']} | "
            f"{result['seconds_from_first_signal_to_all_completed']} | {result['measured_at']} |")
    md = RESULTS / "suspended_runs.md"
    if not md.exists():
        md.write_text("| db | runs | worker RSS idle (MB) | warm (5% suspended) | all suspended | all completed | "
                      "peak threads | leased while suspended | s until all suspended | s signals -> all completed "
                      "| measured |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    with md.open("a") as fh:
        fh.write(line + "\n")
    print(json.dumps(result, indent=2))
    print(line)


if __name__ == "__main__":
    main()
