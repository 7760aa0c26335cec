#!/usr/bin/env python
"""Per-step journal overhead for each durability mode, beside the floor of one INSERT + COMMIT.

    .venv/bin/python bench/step_overhead.py [--steps 2000] [--repeat 5] [--postgres URL]

Runs on SQLite (a fresh file, WAL, synchronous=FULL) and on PostgreSQL (a fresh database),
each in its own process, and writes bench/results/step_overhead.json and .md. The floor is
the same-sized row inserted by raw SQL in autocommit mode: what any durable engine must pay
per step. Numbers are medians over --repeat runs, and ratios are taken within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
import django  # noqa: E402

django.setup()  # before the decorators: they register steps with an engine that imports its models

import journal  # noqa: E402


@journal.step()
def tiny(i: int) -> int:
    return i + 1


def _steps(ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total += tiny(i)
    return total


@journal.workflow(name="bench_sync", durability="sync")
def bench_sync(ctx, n: int) -> int:
    return _steps(ctx, n)


@journal.workflow(name="bench_async", durability="async")
def bench_async(ctx, n: int) -> int:
    return _steps(ctx, n)


@journal.workflow(name="bench_exit", durability="exit")
def bench_exit(ctx, n: int) -> int:
    return _steps(ctx, n)


def measure(steps: int, repeat: int) -> dict:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from journal.driver import executor, leases

    def floor_once() -> float:
        """The same record into the same table (same indexes), one plain INSERT + COMMIT per step:
        no fencing, no trace, no engine. What any durable engine must pay to record a step."""
        from django.utils import timezone

        from journal.models import Run

        run = Run.objects.create(agent="bench_floor")
        payload = json.dumps({"result": 1, "args": {"args": [1], "kwargs": {}}, "args_hash": "0123456789abcdef",
                              "attempt": 1, "kind": "step", "duration_ms": 0.001,
                              "started_at": "2026-01-01T00:00:00+00:00"})
        pg = connection.vendor == "postgresql"
        run_param = run.id if pg else run.id.hex
        sql = ("INSERT INTO journal_sessionevent (run_id, seq, kind, position, step_name, payload, actor, "
               "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
        with connection.cursor() as cur:
            t0 = time.perf_counter()
            for i in range(1, steps + 1):
                now = timezone.now()
                cur.execute(sql, [run_param, i, "step_completed", i, "tiny", payload, "",
                                  now if pg else str(now.replace(tzinfo=None))])
            elapsed = time.perf_counter() - t0
        return elapsed / steps * 1e6

    def mode_once(mode: str) -> float:
        run_id = journal.start(f"bench_{mode}", steps)
        [claim] = leases.claim("bench", 1, run_id=run_id)
        t0 = time.perf_counter()
        status = executor.drive(claim, "bench")
        elapsed = time.perf_counter() - t0
        assert status == "completed", status
        return elapsed / steps * 1e6

    def plain_once() -> float:
        t0 = time.perf_counter()
        total = 0
        for i in range(steps):
            total += tiny(i)
        return (time.perf_counter() - t0) / steps * 1e6

    samples: dict[str, list[float]] = {"floor": [], "sync": [], "async": [], "exit": [], "plain": []}
    for _ in range(repeat):
        samples["floor"].append(floor_once())
        for mode in ("sync", "async", "exit"):
            samples[mode].append(mode_once(mode))
        samples["plain"].append(plain_once())
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "vendor": connection.vendor,
        "steps": steps,
        "repeat": repeat,
        "median_us_per_step": {k: round(v, 1) for k, v in med.items()},
        "sync_over_floor": round(med["sync"] / med["floor"], 2),
        "samples_us": {k: [round(x, 1) for x in v] for k, v in samples.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES_URL",
                                                             "postgres://postgres@127.0.0.1:5432/durable_bench"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.steps, args.repeat)))
        return

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = [("sqlite", f"sqlite:///{tmp}/bench.sqlite3")]
        if args.postgres:
            targets.append(("postgresql", args.postgres))
        for name, url in targets:
            if name == "postgresql":
                _recreate_pg(url)
            env = {**os.environ, "DATABASE_URL": url, "DURABLE_LOG_LEVEL": "WARNING"}
            out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps), "--repeat",
                                  str(args.repeat)], env=env, capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                print(f"{name}: failed\n{out.stderr[-3000:]}", file=sys.stderr)
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name}: done", file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "step_overhead.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| database | floor (INSERT+COMMIT) | sync | async | exit | sync / floor |",
             "|---|---|---|---|---|---|"]
    for r in results:
        m = r["median_us_per_step"]
        lines.append(f"| {r['vendor']} | {m['floor']} µs | {m['sync']} µs | {m['async']} µs | {m['exit']} µs | "
                     f"{r['sync_over_floor']}× |")
    table = "\n".join(lines)
    (RESULTS / "step_overhead.md").write_text(
        f"Per-step journal overhead, median of {args.repeat} runs of {args.steps} steps (µs per step).\n\n{table}\n")
    print(table)


def _recreate_pg(url: str) -> None:
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
