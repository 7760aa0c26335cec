"""The workloads, run in a child process per (system, database) so that each system has its own
interpreter, its own global state (Django settings, DBOS's singleton) and its own fresh store.

    python -m bench.peers.workloads SYSTEM STORE_JSON JOB [options]   (run.py calls this)

Jobs: ``timing`` (per-step overhead in each durability mode, then throughput at each concurrency),
``storage`` (a conversation growing by 1 KiB per step), ``crash-first`` / ``crash-resume`` (the two
processes of the crash-recovery workload: recovery.py kills the first). Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from langgraph_storage import PAYLOAD, _content  # noqa: E402  (the same 1-KiB, barely compressible messages)

from bench.peers.databases import Store, disk_bytes, server_cpu_seconds  # noqa: E402

SYSTEMS = {"floor": "floor", "durable-ui": "durable", "LangGraph": "langgraph_peer", "DBOS": "dbos_peer"}
CRASH_STEPS, CRASH_STEP_SECONDS = 20, 0.05


def message(i: int) -> str:
    """Message i of the conversation: 1,024 characters of base64 noise (what bench/langgraph_storage.py writes)."""
    return _content(i)


def threaded(one: Callable[[int], object], runs: int, concurrency: int) -> None:
    """Call ``one(i)`` for i in range(runs) from ``concurrency`` threads; re-raise the first failure."""
    if concurrency == 1:
        for i in range(runs):
            one(i)
        return
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(one, i) for i in range(runs)]:
            future.result()


def record_effect(log: Path, i: int, key: str = "") -> None:
    """The outside side effect of crash step i: one line per execution, so duplicates can be counted
    (with the idempotency key an effect step is given, which the outside system keeps)."""
    with log.open("a") as f:
        f.write(f"{i} {time.time():.3f} {key}".rstrip() + "\n")


def effect_log(log: Path) -> list[tuple[int, float, str]]:
    """The crash log as written by ``record_effect``: (step, when it ended, idempotency key or "") per
    real execution, in order."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(fields[0]), float(fields[1]), fields[2] if len(fields) > 2 else "")
            for fields in (line.split() for line in lines) if fields]


def effects_done(log: Path) -> set[str]:
    """The idempotency keys in the log: what an outside system answers when asked whether a key's call
    went through."""
    return {key for _, _, key in effect_log(log) if key}


def timed(call: Callable[[], object], store: Store) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the whole process with every thread, CPU seconds of the database
    server: 0 for SQLite, whose work is in the process's own)."""
    s0 = server_cpu_seconds(store)
    w0, c0 = time.perf_counter(), time.process_time()
    call()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    s1 = server_cpu_seconds(store)
    return wall, cpu, (s1 - s0) if s0 is not None and s1 is not None else 0.0


def timing(system, store: Store, steps: int, runs: int, run_steps: int, concurrencies: list[int]) -> dict:
    system.one_run(20)  # warm up: imports, prepared statements, caches, the first connection
    per_step = {}
    for mode in system.modes:
        wall, cpu, server = timed(partial(system.one_run, steps, mode), store)
        per_step[mode] = {"wall_us": wall / steps * 1e6, "cpu_us": cpu / steps * 1e6,
                          "server_cpu_us": server / steps * 1e6}
    throughput = {}
    for c in concurrencies:
        if hasattr(system, "prepare"):  # a worker with c slots, made outside the timing (durable.py)
            system.prepare(c)
        wall, cpu, server = timed(partial(system.many_runs, runs, run_steps, c), store)
        throughput[str(c)] = {"runs_per_s": runs / wall, "cpu_ms_per_run": cpu / runs * 1e3,
                              "server_cpu_ms_per_run": server / runs * 1e3}
    return {"per_step": per_step, "throughput": throughput}


def storage(system, store: Store, messages: list[int]) -> dict:
    system.conversation(10, base=0)  # first pages of every table and index: a fixed cost, not growth
    rows = []
    for k, n in enumerate(messages):
        before = disk_bytes(store)
        system.conversation(n, base=100_000 * (k + 1))  # new content each time: nothing to deduplicate
        grown = disk_bytes(store) - before
        rows.append({"messages": n, "payload": n * PAYLOAD, "bytes": grown, "per_payload_byte": grown / (n * PAYLOAD)})
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("system", choices=list(SYSTEMS))
    parser.add_argument("store")
    parser.add_argument("job", choices=["timing", "storage", "crash-first", "crash-resume"])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--run-steps", type=int, default=10)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--messages", default="100,200")
    parser.add_argument("--log", default="")
    parser.add_argument("--effects", action="store_true", help="crash: durable-ui's effect steps (effect=True)")
    args = parser.parse_args()
    store = Store(**json.loads(args.store))
    module = importlib.import_module(f"bench.peers.{SYSTEMS[args.system]}")
    if args.job.startswith("crash"):
        module.crash(store, Path(args.log), resume=args.job == "crash-resume",
                     **({"effects": True} if args.effects else {}))
        print(json.dumps({"done": True}), flush=True)
        return
    system = module.open_system(store)
    try:
        if args.job == "timing":
            concurrencies = [int(c) for c in args.concurrency.split(",")]
            out = timing(system, store, args.steps, args.runs, args.run_steps, concurrencies)
        else:
            out = storage(system, store, [int(n) for n in args.messages.split(",")])
    finally:
        system.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
