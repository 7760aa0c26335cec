"""SIGKILL a worker mid-run, start a new one: how long until the run is done, and what ran twice?

    .venv/bin/python bench/restart_recovery.py [--rounds 5]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_bench .venv/bin/python bench/restart_recovery.py

Each round: a run of 20 steps of 50 ms starts, a `runworker` process (the default 30 s lease)
takes it, is SIGKILLed about half-way, and a new `runworker` starts at once. Measured: seconds
from the new worker's start to the run's completion, and steps executed twice (the one in
flight when the process died is expected: plain steps are at-least-once; effects are not).
Written to bench/results/restart_recovery-<db>.json and .md.
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
os.environ["PYTHONPATH"] = f"{ROOT / 'bench'}:{ROOT}"
sys.path.insert(0, str(ROOT / "bench"))

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import journal  # noqa: E402


def worker() -> subprocess.Popen:
    env = {**os.environ, "DURABLE_LEASE_SECONDS": "30"}
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runworker", "--poll", "0.05"], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def steps_done(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def one_round(log: Path) -> dict:
    log.unlink(missing_ok=True)
    run_id = journal.start("bench-restart", 20)
    first = worker()
    deadline = time.monotonic() + 60
    while len(steps_done(log)) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    t0 = time.perf_counter()
    second = worker()
    run = journal.wait(run_id, timeout=120)
    seconds = time.perf_counter() - t0
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=60)
    counts = Counter(steps_done(log))
    return {"status": run.status, "seconds_to_done": round(seconds, 3),
            "steps_run_twice": sum(1 for c in counts.values() if c > 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    log = Path(tempfile.gettempdir()) / "bench-restart-steps.log"
    os.environ["BENCH_RESTART_LOG"] = str(log)
    rows = [one_round(log) for _ in range(args.rounds)]
    secs = [r["seconds_to_done"] for r in rows]
    summary = {"database": connection.vendor, "rounds": rows, "median_s": statistics.median(secs),
               "min_s": min(secs), "max_s": max(secs), "lease_seconds": 30,
               "note": "includes the new worker's start-up (Python + Django) and the ~0.5 s of remaining steps"}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"restart_recovery-{connection.vendor}.json").write_text(json.dumps(summary, indent=1))
    md = ("| database | restart -> run done, median (min-max) | steps run twice per crash | lease |\n"
          "|---|---|---|---|\n"
          f"| {connection.vendor} | {summary['median_s']:.2f} s ({summary['min_s']:.2f}-{summary['max_s']:.2f}) | "
          f"{max(r['steps_run_twice'] for r in rows)} | 30 s |\n")
    (out / f"restart_recovery-{connection.vendor}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
