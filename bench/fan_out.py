"""Does a fan-out of n children finish in time linear in n? (map_children, concurrency 8)

    .venv/bin/python bench/fan_out.py [--sizes 100,200,500] [--concurrency 8] [--workers 4]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_bench .venv/bin/python bench/fan_out.py

Each size runs a parent whose ``map_children`` starts n tiny children (one step each), driven by
one embedded worker with ``--workers`` threads, from start to the parent's completion. Written:
bench/results/fan_out-<db>.json and .md, with seconds per child (flat when the cost is O(n)) and
how many times the parent was driven (it wakes once when its group has ended).
Without DATABASE_URL it uses a throwaway SQLite file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
if not os.environ.get("DATABASE_URL"):
    path = Path(tempfile.gettempdir()) / "bench-fan_out.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import journal  # noqa: E402
from journal.driver.worker import EmbeddedWorker  # noqa: E402
from journal.models import EventKind, Run, SessionEvent  # noqa: E402


@journal.step()
def square(n: int) -> int:
    return n * n


@journal.workflow(name="bench-fan-out-child")
def child(ctx, n: int) -> int:
    return square(n)


@journal.workflow(name="bench-fan-out")
def parent(ctx, n: int, concurrency: int) -> int:
    return sum(ctx.map_children(child, list(range(n)), concurrency=concurrency))


def one(n: int, concurrency: int, workers: int) -> dict:
    t0 = time.perf_counter()
    run_id = journal.start("bench-fan-out", n, concurrency)
    EmbeddedWorker(concurrency=workers, poll_interval=0.01).run(until_idle=True, max_seconds=3600)
    seconds = time.perf_counter() - t0
    run = Run.objects.get(id=run_id)
    assert run.status == "completed" and run.output == sum(i * i for i in range(n)), (run.status, run.error)
    drives = SessionEvent.objects.filter(run_id=run_id,
                                         kind__in=[EventKind.RUN_CLAIMED, EventKind.RUN_RECOVERED]).count()
    return {"children": n, "seconds": round(seconds, 3), "ms_per_child": round(seconds * 1000 / n, 2),
            "parent_drives": drives}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100,200,500")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    rows = [one(int(n), args.concurrency, args.workers) for n in args.sizes.split(",")]
    db = connection.vendor
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fan_out-{db}.json").write_text(json.dumps({"database": db, "concurrency": args.concurrency,
                                                        "worker_threads": args.workers, "rows": rows}, indent=1))
    table = ["| children | seconds | ms per child | parent drives |", "|---|---|---|---|"]
    table += [f"| {r['children']} | {r['seconds']} | {r['ms_per_child']} | {r['parent_drives']} |" for r in rows]
    (out / f"fan_out-{db}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
