"""How long does journal.state_at take on a 10k-position run? (the stepper calls it on every click)

    .venv/bin/python bench/state_at.py [--steps 10000] [--calls 300]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_bench .venv/bin/python bench/state_at.py

The run is made by the real engine (exit durability, so building it is quick): an addition
per step, explicit state every 100 steps, a sandbox file every 1,000. Then ``state_at`` is
called at random positions; medians and p95 in ms go to bench/results/state_at-<db>.json and .md.
Without DATABASE_URL it uses a throwaway SQLite file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
if not os.environ.get("DATABASE_URL"):
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.gettempdir()}/bench-state_at.sqlite3"
os.environ.setdefault("DURABLE_SANDBOX_ROOT", tempfile.mkdtemp(prefix="bench-sandboxes-"))

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import journal  # noqa: E402
from journal.driver.worker import EmbeddedWorker  # noqa: E402


@journal.step()
def bump(total: int, i: int) -> int:
    return total + i


@journal.workflow(name="bench-state-at", durability="exit")
def long_run(ctx, n: int) -> int:
    total = 0
    for i in range(1, n + 1):
        total = bump(total, i)
        if i % 100 == 0:
            ctx.set_state({"total": total, "i": i, "history": list(range(i // 100))})
        if i % 1000 == 0:
            ctx.sandbox.write_file(f"part-{i // 1000}.txt", str(total))
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    run_id = journal.start("bench-state-at", args.steps)
    EmbeddedWorker(concurrency=1, poll_interval=0.01).run(until_idle=True, max_seconds=1800)
    build_s = time.perf_counter() - t0
    if connection.vendor == "postgresql":  # what autovacuum would have done by the time anyone clicks
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    run = journal.get_run(run_id)
    assert run.status == "completed", run.error
    total = journal.state_at(run_id, 1).total
    rng = random.Random(7)
    positions = [rng.randint(1, total) for _ in range(args.calls)]
    for p in positions[:20]:  # warm up
        journal.state_at(run_id, p)
    times = []
    for p in positions:
        t = time.perf_counter()
        at = journal.state_at(run_id, p)
        times.append((time.perf_counter() - t) * 1000)
        assert at.position == p
    times.sort()
    result = {
        "database": connection.vendor, "positions": total, "calls": len(times),
        "median_ms": round(statistics.median(times), 3), "p95_ms": round(times[int(len(times) * 0.95) - 1], 3),
        "max_ms": round(times[-1], 3), "build_run_s": round(build_s, 1),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"state_at-{connection.vendor}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = ("| database | positions | calls | median ms | p95 ms | max ms |\n|---|---|---|---|---|---|\n"
             f"| {result['database']} | {total} | {len(times)} | {result['median_ms']} | {result['p95_ms']} | "
             f"{result['max_ms']} |\n")
    (out / f"state_at-{connection.vendor}.md").write_text(table)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
