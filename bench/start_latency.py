#!/usr/bin/env python
"""From ``journal.start`` to ``journal.wait`` returning the finished run, with an embedded worker in the
same process (``make demo``, ``runworker`` beside a script), with the doorbells and without them.

    .venv/bin/python bench/start_latency.py [--runs 40] [--rounds 3] [--postgres URL]

The worker polls every 0.2 s, ``runworker``'s default. With the doorbells, a start wakes the worker's
claim loop and the end of the drive wakes the waiter; without them (the bells silenced in this
process, as before they existed) the worker finds the run at its next poll and the waiter at its
next read (every 20 ms at first, backing off). Runs of one tiny step, one at a time, the two ways
interleaved round by round. Writes bench/results/start_latency.json and .md.
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
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
os.environ.setdefault("DURABLE_LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

import journal  # noqa: E402


@journal.step()
def tiny(i: int) -> int:
    return i + 1


@journal.workflow(name="bench_latency")
def bench_latency(ctx, n: int) -> int:
    return tiny(n)


def measure(runs: int, rounds: int) -> dict:
    from django.core.management import call_command

    from journal.driver.worker import EmbeddedWorker
    from journal.store import doorbell

    call_command("migrate", verbosity=0)
    worker = EmbeddedWorker(concurrency=2, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    while worker._wake.set not in doorbell._listeners:
        time.sleep(0.01)
    ring_stopped = doorbell.stopped

    def latencies(bells: bool) -> list[float]:
        if bells:
            doorbell.listen(worker._wake.set)
            doorbell.stopped = ring_stopped
        else:
            doorbell.unlisten(worker._wake.set)
            doorbell.stopped = lambda run_id: None
        out = []
        for i in range(runs):
            t0 = time.perf_counter()
            run = journal.wait(journal.start("bench_latency", i), timeout=30)
            out.append((time.perf_counter() - t0) * 1000)
            assert run.status == "completed", run.status
        return out

    latencies(True)  # warm up
    samples: dict[str, list[float]] = {"bells": [], "polling": []}
    for _ in range(rounds):
        samples["polling"] += latencies(False)
        samples["bells"] += latencies(True)
    worker.request_stop()
    thread.join(30)

    def q(values: list[float], p: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(p * len(values)))], 2)

    from django.db import connection

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
    lines = ["| database | with the doorbells: median / p90 | polling (0.2 s worker poll): median / p90 |",
             "|---|---|---|"]
    for r in results:
        b, p = r["bells"], r["polling"]
        lines.append(f"| {r['vendor']} | {b['median_ms']} / {b['p90_ms']} ms | {p['median_ms']} / {p['p90_ms']} ms |")
    table = "\n".join(lines)
    (RESULTS / "start_latency.md").write_text(
        f"# journal.start → journal.wait, one-step run, worker in the same process\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
