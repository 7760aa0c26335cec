#!/usr/bin/env python
"""Instructions a short run costs, counted by valgrind (cachegrind): the same number every time.

    .venv/bin/python bench/instructions.py [--steps 10] [--runs 60] [--tree PATH ...]

Timings on these shared 2-core machines move by ±30 % from one minute to the next, more than most
changes to the engine's hot path are worth; an instruction count does not move at all (the same
binary, inputs and environment give the same total, whatever else the machine does). So this
counts, for each tree (default: this checkout; give an older commit's worktree to compare,
``git worktree add /tmp/base REV``), the instructions of ``--runs`` runs of ``--steps`` trivial
steps (start, claim, drive and settle, one after another in one process) minus those of the same
process making no run, and the same for a run of no steps; the difference is the per-step cost.
Beside them, the floor: a run as one INSERT, a row per step, and an UPDATE, through ``sqlite3``.

Everything runs on SQLite with ``synchronous=OFF``: what is counted is the CPU's work, not the
disk's. Writes bench/results/instructions.json and .md. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
WARM_UP = 5  # runs every child makes before counting starts: imports, caches, compiled statements


def durable_child(tree: str, runs: int, steps: int) -> None:
    """Set up Django in ``tree``, warm up, then drive ``runs`` runs of ``steps`` steps."""
    sys.path.insert(0, tree)
    os.chdir(tree)
    os.environ["DJANGO_SETTINGS_MODULE"] = "durable_ui.settings"
    os.environ["DURABLE_LOG_LEVEL"] = "WARNING"
    os.environ["DURABLE_SQLITE_SYNCHRONOUS"] = "OFF"
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp()}/instructions.sqlite3"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import instructions_agents  # noqa: F401  (the workflow, registered once Django is set up)

    import journal
    from journal.driver import executor, leases

    def one(n: int) -> None:
        run_id = journal.start("bench_instructions", n)
        [claim] = leases.claim("bench", 1, run_id=run_id)
        assert executor.drive(claim, "bench") == "completed"

    for _ in range(WARM_UP):
        one(steps)
    for _ in range(runs):
        one(steps)


def floor_child(runs: int, steps: int) -> None:
    """The floor of bench/peers/floor.py on SQLite: a run row, a row per step, the run marked done."""
    import sqlite3

    conn = sqlite3.connect(f"{tempfile.mkdtemp()}/floor.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("CREATE TABLE run (id INTEGER PRIMARY KEY, status TEXT NOT NULL, input TEXT, output TEXT)")
    conn.execute("CREATE TABLE step (run_id BIGINT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, "
                 "output TEXT, PRIMARY KEY (run_id, seq))")

    def one(n: int) -> None:
        run_id = conn.execute("INSERT INTO run (status, input) VALUES ('running', ?) RETURNING id",
                              ["{}"]).fetchone()[0]
        for seq in range(1, n + 1):
            conn.execute("INSERT INTO step (run_id, seq, name, output) VALUES (?, ?, ?, ?)",
                         [run_id, seq, "tiny", str(seq)])
        conn.execute("UPDATE run SET status = 'done', output = ? WHERE id = ?", ["0", run_id])

    for _ in range(WARM_UP):
        one(steps)
    for _ in range(runs):
        one(steps)


def count(args: list[str]) -> int:
    """Instructions the child process executed (valgrind's "I refs")."""
    # A fixed hash seed: dicts and sets lay out the same way in every child, so counts repeat exactly.
    out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return int(found.group(1).replace(",", ""))


def per_run(target: list[str], runs: int, steps: int) -> int:
    """Instructions of one run of ``steps`` steps: (``runs`` runs) − (no runs), divided by ``runs``."""
    base = count([*target, "--runs", "0", "--steps", str(steps)])
    return round((count([*target, "--runs", str(runs), "--steps", str(steps)]) - base) / runs)


def measure(label: str, target: list[str], runs: int, steps: int) -> dict:
    empty, full = per_run(target, runs, 0), per_run(target, runs, steps)
    row = {"system": label, "run_of_no_steps": empty, f"run_of_{steps}_steps": full,
           "per_step": round((full - empty) / steps) if steps else 0}
    print(f"{label}: {full:,} instructions per {steps}-step run, {empty:,} per run of no steps, "
          f"{row['per_step']:,} per step", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--tree", action="append", help="a durable-ui checkout (repeatable; default: this one)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--at", default=str(ROOT), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.floor:
            floor_child(args.runs, args.steps)
        else:
            durable_child(args.at, args.runs, args.steps)
        return
    rows = [measure("floor", ["--floor"], args.runs, args.steps)]
    for tree in args.tree or [str(ROOT)]:
        label = subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h"], capture_output=True,
                               text=True).stdout.strip() or tree
        rows.append(measure(f"durable-ui {label}", ["--at", tree], args.runs, args.steps))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "instructions.json").write_text(json.dumps(rows, indent=1) + "\n")
    floor = rows[0]
    lines = [f"| system | per run of {args.steps} steps | ÷ floor | per run of no steps | per step | ÷ floor |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        full = r[f"run_of_{args.steps}_steps"]
        lines.append(f"| {r['system']} | {full:,} | {full / floor[f'run_of_{args.steps}_steps']:.1f}× | "
                     f"{r['run_of_no_steps']:,} | {r['per_step']:,} | {r['per_step'] / floor['per_step']:.1f}× |")
    table = "\n".join(lines)
    (RESULTS / "instructions.md").write_text(
        f"Instructions (valgrind cachegrind, SQLite, synchronous=OFF), {args.runs} runs counted after "
        f"{WARM_UP} warm-up runs.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
