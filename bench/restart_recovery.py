"""SIGKILL a worker mid-run, start a new one: how long until the run is done, and what ran twice?

    .venv/bin/python bench/restart_recovery.py [--rounds 5] [--celery]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_bench .venv/bin/python bench/restart_recovery.py

Each round: a run of 20 steps of 50 ms starts, a `runworker` process (the default 30 s lease)
takes it, is SIGKILLed about half-way, and a new `runworker` starts at once. Measured, from the
moment the new worker's process is started (Python and Django's start-up included): seconds until
the run resumed (its first step in the new worker began), seconds until its completion committed,
and steps executed twice (the one in flight when the process died is expected: plain steps are
at-least-once; effects are not).
``--celery``: the distributed path instead, a ``celery -A durable_ui worker`` (threads pool, one slot)
killed and started again, with Redis at REDIS_URL (database 11 of it, emptied first) and no beat: the
new worker's start-up takes over the dead one's runs and rings for them (journal.integrations.tasks).
Written to bench/results/restart_recovery-<db>[-celery].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
if not os.environ.get("DATABASE_URL"):
    db = Path(tempfile.gettempdir()) / "bench-restart.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
os.environ["DURABLE_AGENT_MODULES"] = "restart_agents"
CELERY = "--celery" in sys.argv  # read before Django's settings are: they take the broker from the environment
if CELERY:
    os.environ["DURABLE_CELERY"] = "1"
    base = (os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
    os.environ["REDIS_URL"] = f"{base}/11"
os.environ["PYTHONPATH"] = f"{ROOT / 'bench'}:{ROOT}"
sys.path.insert(0, str(ROOT / "bench"))

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from restart_agents import STEP_SECONDS  # noqa: E402

import journal  # noqa: E402


def worker() -> subprocess.Popen:
    env = {**os.environ, "DURABLE_LEASE_SECONDS": "30"}
    command = ([sys.executable, "-m", "celery", "-A", "durable_ui", "worker", "--pool", "threads", "-c", "1",
                "-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat"] if CELERY else
               [sys.executable, str(ROOT / "manage.py"), "runworker", "--poll", "0.05"])
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def executions(log: Path) -> list[tuple[str, float]]:
    """(step, when it ended) for every real execution, in order."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(step, float(at)) for step, at in (line.split() for line in lines if line.strip())]


def steps_done(log: Path) -> list[str]:
    return [step for step, _ in executions(log)]


def one_round(log: Path) -> dict:
    log.unlink(missing_ok=True)
    run_id = journal.start("bench-restart", 20)
    first = worker()
    deadline = time.monotonic() + 60
    while len(steps_done(log)) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = len(executions(log))
    t0, wall0 = time.perf_counter(), time.time()
    second = worker()
    run = journal.wait(run_id, timeout=120)
    seconds = time.perf_counter() - t0
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=60)
    ran = executions(log)
    counts = Counter(step for step, _ in ran)
    # Resumed: the new worker's first step began (it logs when it ends, STEP_SECONDS after it began).
    resumed = ran[before][1] - STEP_SECONDS - wall0 if len(ran) > before else float("nan")
    # Done: when the run's completion committed (this process's wait polls, and would add its interval).
    done = run.finished_at.timestamp() - wall0 if run.finished_at else seconds
    return {"status": run.status, "seconds_to_resumed": round(resumed, 3), "seconds_to_done": round(done, 3),
            "seconds_until_the_waiter_saw_it": round(seconds, 3),
            "steps_run_twice": sum(1 for c in counts.values() if c > 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--celery", action="store_true", help="the distributed path (needs Redis)")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    if args.celery:
        import redis

        redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    log = Path(tempfile.gettempdir()) / "bench-restart-steps.log"
    os.environ["BENCH_RESTART_LOG"] = str(log)
    rows = [one_round(log) for _ in range(args.rounds)]
    secs = [r["seconds_to_done"] for r in rows]
    resumed = [r["seconds_to_resumed"] for r in rows]
    path = f"{connection.vendor}-celery" if args.celery else connection.vendor
    summary = {"database": connection.vendor, "worker": "celery" if args.celery else "runworker", "rounds": rows,
               "median_s": statistics.median(secs),
               "min_s": min(secs), "max_s": max(secs), "resumed_median_s": statistics.median(resumed),
               "resumed_min_s": min(resumed), "resumed_max_s": max(resumed), "lease_seconds": 30,
               "note": "from the new worker's process start (Python + Django included); done includes the "
                       "~0.5 s of remaining steps"}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"restart_recovery-{path}.json").write_text(json.dumps(summary, indent=1))
    md = ("| database | worker | restart -> resumed, median (min-max) | restart -> run done | steps run twice "
          "per crash | lease |\n|---|---|---|---|---|---|\n"
          f"| {connection.vendor} | {summary['worker']} | {summary['resumed_median_s']:.2f} s "
          f"({summary['resumed_min_s']:.2f}-"
          f"{summary['resumed_max_s']:.2f}) | {summary['median_s']:.2f} s ({summary['min_s']:.2f}-"
          f"{summary['max_s']:.2f}) | {max(r['steps_run_twice'] for r in rows)} | 30 s |\n")
    (out / f"restart_recovery-{path}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
