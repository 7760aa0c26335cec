#!/usr/bin/env python
"""From ``journal.start`` to ``journal.wait`` returning the finished run, with the doorbells and without.

    .venv/bin/python bench/start_latency.py [--runs 40] [--rounds 3] [--postgres URL]

Two set-ups, the worker polling every 0.2 s (``runworker``'s default) in both:

- **the same process** (``make demo``, a script beside its embedded worker): with the doorbells a
  start wakes the worker's claim loop and the end of the drive wakes the waiter; without them (the
  bells silenced in this process, as before they existed) the worker finds the run at its next poll
  and the waiter at its next read (every 20 ms at first, backing off);
- **another process** (PostgreSQL only: a ``runworker`` beside this one): with ``DURABLE_PG_NOTIFY``
  on, the worker hears the start's NOTIFY; off, it finds the run at its next poll. The waiter here
  polls in both.

Runs of one tiny step, one at a time, the two ways interleaved round by round. Writes
bench/results/start_latency.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
os.environ.setdefault("DURABLE_LOG_LEVEL", "WARNING")
os.environ["DURABLE_AGENT_MODULES"] = "latency_agents"
os.environ["PYTHONPATH"] = f"{ROOT / 'bench'}:{ROOT}"

import django  # noqa: E402

django.setup()

import journal  # noqa: E402


def measure(runs: int, rounds: int) -> dict:
    from django.conf import settings
    from django.core.management import call_command

    from journal.driver.worker import EmbeddedWorker
    from journal.store import doorbell

    call_command("migrate", verbosity=0)
    settings.DURABLE_PG_NOTIFY = False  # in the same process the bells alone; the NOTIFY is measured across
    worker = EmbeddedWorker(concurrency=2, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    while worker._wake.set not in doorbell._listeners:
        time.sleep(0.01)
    ring_stopped = doorbell.stopped

    def timed_runs() -> list[float]:
        out = []
        for i in range(runs):
            t0 = time.perf_counter()
            run = journal.wait(journal.start("bench_latency", i), timeout=30)
            out.append((time.perf_counter() - t0) * 1000)
            assert run.status == "completed", run.status
        return out

    def latencies(bells: bool) -> list[float]:
        if bells:
            doorbell.listen(worker._wake.set)
            doorbell.stopped = ring_stopped
        else:
            doorbell.unlisten(worker._wake.set)
            doorbell.stopped = lambda run_id: None
        return timed_runs()

    latencies(True)  # warm up
    samples: dict[str, list[float]] = {"bells": [], "polling": []}
    for _ in range(rounds):
        samples["polling"] += latencies(False)
        samples["bells"] += latencies(True)
    worker.request_stop()
    thread.join(30)
    doorbell.stopped = ring_stopped
    settings.DURABLE_PG_NOTIFY = True  # this process's starts send the NOTIFY; the worker chooses to listen

    def across(notify: bool) -> list[float]:
        """The same runs driven by a runworker process beside this one."""
        env = {**os.environ, "DURABLE_PG_NOTIFY": "1" if notify else "0"}
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runworker", "--poll", "0.2"], env=env,
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            journal.wait(journal.start("bench_latency", 0), timeout=60)  # booted, connected, listening
            time.sleep(0.5)
            return timed_runs()
        finally:
            proc.terminate()
            proc.wait(60)

    from django.db import connection

    if connection.vendor == "postgresql":
        samples.update({"notify": [], "poll_across": []})
        for _ in range(rounds):
            samples["poll_across"] += across(False)
            samples["notify"] += across(True)

    def q(values: list[float], p: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(p * len(values)))], 2)

    return {"vendor": connection.vendor, "runs": runs, "rounds": rounds, "poll_interval_s": 0.2,
            **{k: {"median_ms": round(statistics.median(v), 2), "p90_ms": q(v, 0.9), "max_ms": round(max(v), 2)}
               for k, v in samples.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES_URL",
                                                             "postgres://postgres@127.0.0.1:5432/durable_bench"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.runs, args.rounds)))
        return
    from step_overhead import _recreate_pg

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = [("sqlite", f"sqlite:///{tmp}/bench.sqlite3")]
        if args.postgres:
            targets.append(("postgresql", args.postgres))
        for name, url in targets:
            if name == "postgresql":
                _recreate_pg(url)
            out = subprocess.run([sys.executable, __file__, "--child", "--runs", str(args.runs),
                                  "--rounds", str(args.rounds)], env={**os.environ, "DATABASE_URL": url},
                                 capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name}: done")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "start_latency.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| database, where the worker is | with the doorbell: median / p90 | polling (0.2 s): median / p90 |",
             "|---|---|---|"]
    for r in results:
        for label, bell, poll in (("same process", "bells", "polling"), ("another process", "notify", "poll_across")):
            if bell in r:
                b, p = r[bell], r[poll]
                lines.append(f"| {r['vendor']}, {label} | {b['median_ms']} / {b['p90_ms']} ms "
                             f"| {p['median_ms']} / {p['p90_ms']} ms |")
    table = "\n".join(lines)
    (RESULTS / "start_latency.md").write_text(f"# journal.start → journal.wait, one-step run\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
