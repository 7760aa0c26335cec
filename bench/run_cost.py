#!/usr/bin/env python
"""The CPU a short run costs, by phase (start, claim, drive and settle), and throughput at N threads.

    .venv/bin/python bench/run_cost.py [--runs 200] [--steps 10] [--threads 8] [--postgres URL]

A run of ten tiny steps is mostly the run's own life: creating it, claiming it, loading its journal,
settling it. The CPU is measured with ``time.process_time`` around each phase, in one process per
database, and the throughput round drives ``--runs`` runs from ``--threads`` threads with group commit
off and on, interleaved. Writes bench/results/run_cost.json and .md.
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


@journal.workflow(name="bench_short", durability="sync")
def bench_short(ctx, n: int) -> int:
    return sum(tiny(i) for i in range(n))


def measure(runs: int, steps: int, threads: int, rounds: int) -> dict:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, connections

    from journal.driver import executor, leases
    from journal.store import writer

    call_command("migrate", verbosity=0)
    clock = time.process_time

    def one(acc: dict) -> None:
        a = clock()
        run_id = journal.start("bench_short", steps)
        b = clock()
        [claim] = leases.claim("bench", 1, run_id=run_id)
        c = clock()
        assert executor.drive(claim, "bench") == "completed"
        d = clock()
        for key, value in (("start", b - a), ("claim", c - b), ("drive", d - c)):
            acc[key].append(value * 1000)

    def phases() -> dict:
        acc: dict[str, list[float]] = {"start": [], "claim": [], "drive": []}
        for _ in range(runs):
            one(acc)
        return {k: statistics.median(v) for k, v in acc.items()}

    def throughput(group: bool) -> tuple[float, int]:
        settings.DURABLE_GROUP_COMMIT = group
        for _ in range(runs):
            journal.start("bench_short", steps)
        queue = writer._group()
        shared = queue.shared

        def work(k: int) -> None:
            try:
                while claims := leases.claim(f"bench-{k}", 1):
                    executor.drive(claims[0], f"bench-{k}")
            finally:
                connections.close_all()

        t0 = time.perf_counter()
        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return runs / (time.perf_counter() - t0), queue.shared - shared

    for _ in range(20):
        one({"start": [], "claim": [], "drive": []})
    cpu = [phases() for _ in range(rounds)]
    rates: dict[str, list[float]] = {"off": [], "on": []}
    shared = 0
    for _ in range(rounds):
        rates["off"].append(throughput(False)[0])
        rate, n = throughput(True)
        rates["on"].append(rate)
        shared += n
    return {
        "vendor": connection.vendor, "runs": runs, "steps": steps, "threads": threads, "rounds": rounds,
        "cpu_ms_median": {k: round(statistics.median(r[k] for r in cpu), 2) for k in ("start", "claim", "drive")},
        "runs_per_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
        "runs_per_s_range": {k: [round(min(v), 1), round(max(v), 1)] for k, v in rates.items()},
        "records_sharing_a_commit": shared,
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES_URL",
                                                             "postgres://postgres@127.0.0.1:5432/durable_bench"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.runs, args.steps, args.threads, args.rounds)))
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
            env = {**os.environ, "DATABASE_URL": url}
            out = subprocess.run([sys.executable, __file__, "--child", "--runs", str(args.runs), "--steps",
                                  str(args.steps), "--threads", str(args.threads), "--rounds", str(args.rounds)],
                                 env=env, capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                print(f"{name}: failed\n{out.stderr[-3000:]}", file=sys.stderr)
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "run_cost.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| database | start | claim | drive + settle | runs/s, group commit off | on | records that shared |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        c, t, rng = r["cpu_ms_median"], r["runs_per_s"], r["runs_per_s_range"]
        lines.append(f"| {r['vendor']} | {c['start']} ms | {c['claim']} ms | {c['drive']} ms | {t['off']} "
                     f"({rng['off'][0]}–{rng['off'][1]}) | {t['on']} ({rng['on'][0]}–{rng['on'][1]}) | "
                     f"{r['records_sharing_a_commit']} |")
    table = "\n".join(lines)
    (RESULTS / "run_cost.md").write_text(
        f"CPU per run of {args.steps} steps (median, ms) and throughput of {args.runs} runs at {args.threads} "
        f"threads (median of {args.rounds} rounds, min–max). Load average when measured: "
        f"{', '.join(str(r['load_average']) for r in results)}.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
