"""durable-ui beside DBOS and LangGraph and the floor, in one run: `make bench-peers`.

    bench/peers/.venv/bin/python -m bench.peers.run [--quick] [--rounds 3] [--no-postgres]

Every round runs every system on every database, in an order that rotates from round to round,
each in a child process on a fresh store (bench/peers/workloads.py); the crash-recovery rounds
are interleaved the same way. Writes bench/results/peers.json (every sample), bench/RESULTS.md
and bench/results/peers.html (a plotly chart).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import psycopg

from . import databases, recovery, report
from .workloads import CRASH_STEP_SECONDS, CRASH_STEPS, ROOT

SYSTEMS = ("floor", "durable-ui", "LangGraph", "DBOS")
LABELS = {"floor": "floor", "durable-ui": "durable", "LangGraph": "langgraph", "DBOS": "dbos"}
RESULTS = ROOT / "bench" / "results"

METHOD = """\
- **The floor**: a minimal journal, one INSERT + COMMIT per step (autocommit) straight through `sqlite3` / psycopg;
  a run is a row inserted, one row per step, the row marked done (n + 2 commits). `bench/peers/floor.py`.
- **durable-ui**: `@journal.workflow` / `@journal.step`, `journal.start`, `journal.wait`, driven by an embedded
  worker (`EmbeddedWorker`, the one `runworker` runs) that keeps running between runs, as a deployed one does;
  the concurrency is its number of slots, made (threads connected) before the timing. A run's time includes
  its start, the worker's claim of it and the waiter seeing it done.
  `bench/peers/durable.py`.
- **LangGraph**: a `StateGraph` whose one node loops (one super-step and one checkpoint per step),
  `SqliteSaver` / `PostgresSaver` (a psycopg pool), `invoke(..., durability=mode)`; a run is a new thread.
  `bench/peers/langgraph_peer.py`.
- **DBOS**: `@DBOS.workflow` calling `@DBOS.step`, its system database on SQLite or PostgreSQL, the workflow called
  inline; concurrency = that many calling threads. `bench/peers/dbos_peer.py`.
- SQLite: WAL, synchronous=FULL for the floor and durable-ui; LangGraph and DBOS keep their own settings. PostgreSQL:
  the local server, defaults (fsync on). Each (system, database, round) has a fresh file or database.
- Per step: wall time of one run of {steps} trivial steps divided by {steps}, after a 20-step warm-up run in the same
  process; CPU = the process's CPU time (all threads) over the same span.
- Throughput: {runs} runs × {run_steps} trivial steps at each concurrency ({concurrency}), from the first start to the
  last completion.
- Server CPU (PostgreSQL): the CPU the local server used over the same span, the postmaster and every backend read
  from /proc (backends that exited meanwhile through the postmaster's reaped-children counters), background
  processes included. "CPU ms per run, client + server" adds it to the process's own: with the machine's cores
  it bounds the runs/s a system can reach here (2 cores: at most 2,000 ÷ that number).
- Crash recovery: a run of {crash_steps} steps of {crash_ms} ms, each appending to an outside log file when it really
  runs; the process is SIGKILLed after {half} steps; a new process starts at once. Times from its start (Python and
  imports included) to the run resuming (its first step in the new process began, from the log's timestamps) and to
  the run being done as that process sees it. durable-ui: a new embedded worker with the default
  30 s lease (it registers, sees the dead worker's pid gone, takes its runs); LangGraph: the caller invokes the same
  thread again (nothing else would); DBOS: `DBOS.launch()` again (it recovers the executor's pending workflows).
  Duplicate effects = executions beyond the first, from the log; all are plain steps (at-least-once in every system).
  durable-ui is also crashed with the same steps as effects (`@journal.step(effect=True, on_in_doubt="reconcile")`,
  the log asked for the step's idempotency key, as an outside system is asked): its own rows below.
- Storage: a conversation growing by one 1-KiB message (base64 noise, as bench/langgraph_storage.py) per step, kept as
  the run's state (durable-ui `ctx.set_state`, LangGraph a list channel with `operator.add`, DBOS the workflow's
  step outputs, the floor one row per message); bytes = growth of the store's tables, indexes and TOAST on disk.
  Run once per database ({messages} messages, after a 10-message conversation that allocates the first pages of
  every table and index); the growth exponent is from the two sizes.
- Rounds: {rounds}; within a round the order of the systems rotates. Medians with (min–max) over the rounds.
"""


def child(system: str, store: databases.Store, job: str, extra: list[str], log: Path) -> dict:
    cmd = [sys.executable, "-m", "bench.peers.workloads", system, json.dumps(asdict(store)), job, *extra]
    with log.open("a") as err:
        out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{system} {job} on {store.kind} failed (exit {out.returncode}); see {log}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def environment() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    versions = {}
    for dist in ("durable-ui", "Django", "dbos", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
                 "langgraph-checkpoint-postgres", "psycopg", "plotly"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    try:
        with psycopg.connect(f"{databases.POSTGRES_SERVER}/postgres") as conn:
            pg = conn.execute("SHOW server_version").fetchone()[0]
    except psycopg.Error:
        pg = "unreachable"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "CPU": f"{cpu}, {os.cpu_count()} cores",
            "load average at start (1, 5, 15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "Python": platform.python_version(), "SQLite": sqlite3.sqlite_version, "PostgreSQL": pg,
            "durable-ui commit": commit.strip(), **{f"{k}": v for k, v in versions.items()}}


def write(env: dict, p: dict, samples: dict) -> dict:
    """Save every sample and render RESULTS.md and the chart (after every round: a stopped run keeps its rounds)."""
    results = {"env": env, "params": p, "samples": samples}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "peers.json").write_text(json.dumps(results, indent=1) + "\n")
    method = METHOD.format(crash_steps=CRASH_STEPS, crash_ms=int(CRASH_STEP_SECONDS * 1000), half=CRASH_STEPS // 2,
                           concurrency=", ".join(map(str, p["concurrency"])),
                           messages=", ".join(map(str, p["messages"])), **{k: v for k, v in p.items()
                                                                          if k not in ("concurrency", "messages")})
    (ROOT / "bench" / "RESULTS.md").write_text(report.render(results, method))
    report.chart(results).write_html(RESULTS / "peers.html", include_plotlyjs="../../static/vendor/plotly.min.js")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a minute or two")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--only-postgres", action="store_true")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    args = parser.parse_args()
    q = args.quick
    p = {"quick": q, "rounds": args.rounds or (1 if q else 3), "steps": 100 if q else 500, "runs": 40 if q else 200,
         "run_steps": 10, "concurrency": [1, 8], "messages": [25, 50] if q else [100, 200],
         "crash_rounds": args.rounds or (1 if q else 3)}
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    dbs = ["sqlite"] if args.no_postgres else ["postgres"] if args.only_postgres else ["sqlite", "postgres"]
    env = environment()
    samples: dict = {"per_step": {}, "per_step_cpu": {}, "per_step_server_cpu": {}, "throughput": {},
                     "run_cpu": {}, "recovery": {}, "recovery_effects": {}, "storage": {}}
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    errlog = work / "children.log"
    timing_args = ["--steps", str(p["steps"]), "--runs", str(p["runs"]), "--run-steps", str(p["run_steps"]),
                   "--concurrency", ",".join(map(str, p["concurrency"]))]
    t_start = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    def on_fresh(system: str, db: str, job: str, call):
        store = databases.fresh(db, f"{LABELS[system]}_{job}", work)
        try:
            return call(store)
        finally:
            databases.drop(store)

    for db in dbs:
        for system in systems:
            say(f"{system} on {db}: storage")
            samples["storage"].setdefault(db, {})[system] = on_fresh(
                system, db, "storage", lambda st, system=system: child(system, st, "storage",
                                                         ["--messages", ",".join(map(str, p["messages"]))], errlog))
    def crash(r: int, system: str, db: str, *, effects: bool) -> None:
        say(f"round {r + 1}: {system} on {db}: crash recovery{', effect steps' if effects else ''}")
        got = on_fresh(system, db, "crash", lambda st: recovery.crash_round(system, st, work, effects=effects))
        samples["recovery_effects" if effects else "recovery"].setdefault(db, {}).setdefault(system, []).append(got)
        say(f"  resumed {got['resumed']:.2f} s, done {got['seconds']:.2f} s, {got['duplicates']} duplicate(s)")

    for r in range(max(p["rounds"], p["crash_rounds"])):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for db in dbs:
            for system in order if r < p["rounds"] else []:
                say(f"round {r + 1}: {system} on {db}: per-step and throughput")
                out = on_fresh(system, db, "timing",
                               lambda st, system=system: child(system, st, "timing", timing_args, errlog))
                for mode, v in out["per_step"].items():
                    samples["per_step"].setdefault(db, {}).setdefault(system, {}).setdefault(mode, []).append(
                        v["wall_us"])
                    samples["per_step_cpu"].setdefault(db, {}).setdefault(system, {}).setdefault(mode, []).append(
                        v["cpu_us"])
                    if db == "postgres":
                        samples["per_step_server_cpu"].setdefault(db, {}).setdefault(system, {}).setdefault(
                            mode, []).append(v.get("server_cpu_us", 0.0))
                for c, v in out["throughput"].items():
                    samples["throughput"].setdefault(db, {}).setdefault(system, {}).setdefault(c, []).append(
                        v["runs_per_s"])
                    samples["run_cpu"].setdefault(db, {}).setdefault(system, {}).setdefault(c, []).append(
                        v["cpu_ms_per_run"] + v.get("server_cpu_ms_per_run", 0.0))
            for system in order if r < p["crash_rounds"] else []:
                if system == "floor":
                    continue
                crash(r, system, db, effects=False)
                if system == "durable-ui":  # the same crash with its steps as effects: the ledger's answer
                    crash(r, system, db, effects=True)
        p["rounds_done"] = r + 1
        env["load average at end (1, 5, 15 min)"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        env["bench wall time"] = f"{time.monotonic() - t_start:.0f} s"
        results = write(env, p, samples)
        say(f"round {r + 1} written to bench/RESULTS.md")
    print(report.table(results))
    say(f"wrote bench/RESULTS.md, bench/results/peers.html and peers.json (children's stderr: {errlog})")


if __name__ == "__main__":
    main()
