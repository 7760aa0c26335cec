"""Server time of the dashboard's pages at scale: the runs list over 100k runs and each search term,
a 10k-step journal, and the compare page of that run with a fork from its middle.

    .venv/bin/python bench/dashboard_pages.py [--runs 100000] [--steps 10000] [--repeat 30] [--only search]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/durable_bench_dash .venv/bin/python bench/dashboard_pages.py

Runs are bulk-inserted rows (the list reads only the run table); the long journal is made by the
real engine. Each page is requested through Django's test client in-process (the whole request:
middleware, auth, queries, templates), so the numbers are server time. Medians and p95 in ms go to
bench/results/dashboard_pages-<db>.json and .md. Without DATABASE_URL it uses a throwaway SQLite file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
if not os.environ.get("DATABASE_URL"):
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.gettempdir()}/bench-dashboard.sqlite3"
os.environ.setdefault("DURABLE_SANDBOX_ROOT", tempfile.mkdtemp(prefix="bench-sandboxes-"))

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

import journal  # noqa: E402
from journal.driver.worker import EmbeddedWorker  # noqa: E402
from journal.models import Run, RunStep, step_name_keys  # noqa: E402

STATUSES = ["completed"] * 80 + ["failed"] * 8 + ["suspended"] * 6 + ["running"] * 3 + ["cancelled"] * 3
AGENTS = ["contracts", "coderepair", "research", "triage"]


@journal.step()
def add(total: int, i: int) -> int:
    return total + i


@journal.workflow(name="bench-dashboard-long", durability="exit")
def long_run(ctx, n: int) -> int:
    total = 0
    for i in range(1, n + 1):
        total = add(total, i)
        if i % 500 == 0:
            ctx.set_state({"total": total, "i": i})
    return total


def _step_rows(run: Run, i: int) -> list[RunStep]:
    """The engine's search summary for a seeded run, as the writer would have kept it: each step name
    with its dotted tails; failed runs also the step they failed at."""
    names = ["bench.fetch", "bench.summarize", f"bench.review_{run.agent}"]
    rows = [RunStep(run_id=run.id, name=key, failed=False) for name in names for key in step_name_keys(name)]
    if run.status == "failed":
        rows += [RunStep(run_id=run.id, name=key, failed=True) for key in step_name_keys("bench.parse")]
    return rows


def seed_runs(n: int) -> None:
    if Run.objects.filter(agent__in=AGENTS).count() >= n:
        return
    now = timezone.now()
    batch: list[Run] = []
    steps: list[RunStep] = []

    def flush() -> None:
        Run.objects.bulk_create(batch)
        RunStep.objects.bulk_create(steps, batch_size=5000)
        batch.clear()
        steps.clear()

    for i in range(n):
        status = STATUSES[i % len(STATUSES)]
        created = now - timedelta(seconds=30 * (n - i))
        batch.append(Run(id=uuid.uuid4(), agent=AGENTS[i % len(AGENTS)], version=str(1 + i % 3), status=status,
                         input={"args": [f"document-{i}.pdf"], "kwargs": {}},
                         output={"ok": True} if status == "completed" else None,
                         error="ValueError: parse failed" if status == "failed" else "",
                         steps=i % 40, tokens=i % 5000, cost=(i % 100) / 1000, created_at=created,
                         started_at=created, finished_at=created + timedelta(seconds=i % 300)
                         if status in ("completed", "failed", "cancelled") else None,
                         failed_step="bench.parse" if status == "failed" else "",
                         # one run in ten waited, from seconds to a few hours
                         waited=timedelta(seconds=(i * 37) % 14400) if i % 10 == 0 else timedelta(0)))
        steps += _step_rows(batch[-1], i)
        if len(batch) == 5000:
            flush()
    if batch:
        flush()


# Each search term on the seeded runs: many matches, few, none, and terms combined.
SEARCHES = [
    "status:failed", "agent:research", "version:2", "id:3fa2", 'error:"parse failed"',
    "step:fetch",  # every run
    "step:review_triage",  # a quarter
    "step:bench.review_research",  # a dotted tail
    "step:no_such_step",  # none
    "failed_step:parse",  # the failed runs
    "failed_step:fetch",  # none: ran it, did not fail there
    "waited:>1h", "waited:10m..2h", "cost:>0.05", "cost:0.01..0.02", "tokens:>1000", "tokens:<=10",
    "created:>2026-11-01", "created:<2020-01-01",
    "status:failed step:review_triage cost:>0.05",
]


def timed(client: Client, url: str, repeat: int) -> dict:
    for _ in range(3):
        assert client.get(url).status_code in (200, 286), url
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        client.get(url)
        times.append((time.perf_counter() - t) * 1000)
    with CaptureQueriesContext(connection) as ctx:
        client.get(url)
    times.sort()
    return {"url": url, "median_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1), "queries": len(ctx)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--only", default="", help="time only the pages whose name contains this text")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    seed_runs(args.runs)
    long = Run.objects.filter(agent="bench-dashboard-long", status="completed", forked_from__isnull=True).first()
    if long is None:
        run_id = journal.start("bench-dashboard-long", args.steps)
        EmbeddedWorker(concurrency=1, poll_interval=0.01).run(until_idle=True, max_seconds=1800)
        long = Run.objects.get(id=run_id)
    fork = Run.objects.filter(agent="bench-dashboard-long", forked_from=long, status="completed").first()
    if fork is None:  # the compare page: a fork of the long run from its middle, run to its end
        fork_id = journal.fork(long.id, at_step=args.steps // 2, actor="bench")
        EmbeddedWorker(concurrency=1, poll_interval=0.01).run(until_idle=True, max_seconds=1800)
        fork = Run.objects.get(id=fork_id)
    with connection.cursor() as cursor:  # planner statistics on both (SQLite's PRAGMA optimize does the same)
        cursor.execute("ANALYZE")
    user, _ = User.objects.get_or_create(username="bench-admin", defaults={"is_superuser": True, "is_staff": True})
    client = Client()
    client.force_login(user)
    # a cursor deep in the list (page ~1,000 of 50 rows) without walking there
    from runs.queries import encode_cursor

    deep = Run.objects.order_by("-created_at", "-id").values_list("created_at", "id")[args.runs // 2]
    pages = {
        "runs list, first page": "/",
        "runs list, status=failed": "/?status=failed",
        "runs list, agent + version": "/?agent=research&version=2",
        "runs list, deep page (keyset)": f"/?after={encode_cursor(deep[0], deep[1])}",
        "runs list, sorted by cost": "/?sort=-cost",
        "runs list, text search": "/?q=document-4242.pdf",
        **{f"search {q}": "/?" + urlencode({"q": q}) for q in SEARCHES},
        f"compare, {args.steps}-step run with its fork": f"/runs/compare/?a={long.id}&b={fork.id}",
        "live fragment, 50 ids": "/runs/live/?ids=" + ",".join(
            str(i) for i in Run.objects.filter(status="running").values_list("id", flat=True)[:50]),
        f"run detail, {args.steps}-step journal (last step)": f"/runs/{long.id}/",
        "run detail, step 5000": f"/runs/{long.id}/?step={args.steps // 2}",
        "stepper fragment, step 5000": f"/runs/{long.id}/?step={args.steps // 2}&fragment=journal",
        "tail, after seq 9990": f"/runs/{long.id}/tail/?after={args.steps - 10}",
        "approvals inbox": "/approvals/",
        "overview charts": "/overview/",
        "workers": "/workers/",
    }
    results = []
    for name, url in pages.items():
        if args.only not in name:
            continue
        headers = {"HTTP_HX_REQUEST": "true"} if "fragment" in url else {}
        client.defaults.update(headers)
        row = {"page": name, **timed(client, url, args.repeat)}
        for key in headers:
            client.defaults.pop(key, None)
        results.append(row)
        print(json.dumps(row), flush=True)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    payload = {"database": connection.vendor, "runs": Run.objects.count(), "journal_steps": args.steps,
               "repeat": args.repeat, "pages": results}
    (out / f"dashboard_pages-{connection.vendor}.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [f"Dashboard pages on {connection.vendor}: {payload['runs']} runs, a {args.steps}-step journal "
             f"({args.repeat} requests each, server time in-process)", "",
             "| page | median ms | p95 ms | queries |", "|---|---|---|---|"]
    lines += [f"| {r['page']} | {r['median_ms']} | {r['p95_ms']} | {r['queries']} |" for r in results]
    (out / f"dashboard_pages-{connection.vendor}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
