"""bench/peers/report.py renders RESULTS.md from a fixed result set: the medians, the min-max and
the ratios to the floor and to the best peer (no peer installed: the report is a pure function)."""

from __future__ import annotations

import pytest

from bench.peers import report

RESULTS = {
    "env": {"date": "2026-12-01 12:00 UTC", "CPU": "test CPU, 2 cores"},
    "params": {"quick": False, "rounds": 3, "steps": 500, "runs": 200, "run_steps": 10, "concurrency": [8],
               "messages": [100, 200]},
    "samples": {
        "per_step": {"sqlite": {"floor": {"sync": [100.0, 90.0, 110.0]},
                                "durable-ui": {"sync": [200.0, 300.0, 250.0], "async": [50.0, 40.0, 60.0]},
                                "LangGraph": {"sync": [1000.0, 900.0, 1100.0], "async": [400.0, 500.0, 450.0]},
                                "DBOS": {"sync": [2000.0, 2100.0, 1900.0]}}},
        "per_step_cpu": {},
        "throughput": {"sqlite": {"floor": {"8": [600.0, 500.0, 700.0]},
                                  "durable-ui": {"8": [300.0, 310.0, 290.0]},
                                  "LangGraph": {"8": [70.0, 60.0, 80.0]}, "DBOS": {"8": [30.0, 40.0, 35.0]}}},
        "recovery": {"sqlite": {"durable-ui": [{"seconds": 1.0, "duplicates": 1}] * 3,
                                "LangGraph": [{"seconds": 2.0, "duplicates": 1}, {"seconds": 1.5, "duplicates": 1},
                                              {"seconds": 2.5, "duplicates": 1}],
                                "DBOS": [{"seconds": 4.0, "duplicates": 1}] * 3}},
        "storage": {"sqlite": {
            "floor": {"rows": [{"messages": 100, "payload": 102400, "bytes": 150000, "per_payload_byte": 1.46},
                               {"messages": 200, "payload": 204800, "bytes": 300000, "per_payload_byte": 1.46}]},
            "LangGraph": {"rows": [
                {"messages": 100, "payload": 102400, "bytes": 5_000_000, "per_payload_byte": 48.8},
                {"messages": 200, "payload": 204800, "bytes": 20_000_000, "per_payload_byte": 97.7}]}}},
    },
}


def _line(markdown: str, start: str) -> list[str]:
    [line] = [ln for ln in markdown.splitlines() if ln.startswith(f"| {start}")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_per_step_row_has_medians_ranges_and_both_ratios():
    md = report.render(RESULTS, "method text")
    cells = _line(md, "µs per step, sync, 500-step run, SQLite")
    assert cells[1:5] == ["100 (90–110)", "250 (200–300)", "1,000 (900–1,100)", "2,000 (1,900–2,100)"]
    assert cells[5] == "2.50×"  # 250 / 100
    assert cells[6] == "0.25× (LangGraph)"  # 250 / the lowest peer time, LangGraph's 1,000


def test_a_mode_only_some_systems_have_shows_dashes_and_ratio_to_the_peer_that_has_it():
    cells = _line(report.render(RESULTS, ""), "µs per step, async")
    assert cells[1] == "—" and cells[4] == "—"
    assert cells[5] == "—" and cells[6] == "0.11× (LangGraph)"  # 50 / 450


def test_throughput_best_peer_is_the_highest_and_ratios_follow():
    cells = _line(report.render(RESULTS, ""), "runs/s, 200 runs × 10 steps, 8 concurrent, SQLite")
    assert cells[2] == "300.0 (290.0–310.0)"
    assert cells[5] == "0.50×"  # 300 / 600
    assert cells[6] == "4.29× (LangGraph)"  # 300 / 70


def test_recovery_duplicates_and_storage_growth():
    md = report.render(RESULTS, "method text")
    assert _line(md, "SIGKILL mid-run")[3] == "2.00 (1.50–2.50)"
    assert _line(md, "SIGKILL mid-run")[6] == "0.50× (LangGraph)"
    assert _line(md, "duplicate effects after that crash, plain steps")[2] == "1 (1–1)"
    assert "| SQLite | LangGraph | 200 | 20,000,000 | 97.70 | O(n^2.0) |" in md
    assert "| SQLite | floor | 200 | 300,000 | 1.46 | O(n^1.0) |" in md
    assert "## Environment" in md and "- CPU: test CPU, 2 cores" in md and "method text" in md


def test_a_crash_round_that_timed_the_resume_gets_a_resumed_row_beside_the_done_row():
    timed = {**RESULTS, "samples": {**RESULTS["samples"], "recovery": {"sqlite": {
        "durable-ui": [{"seconds": 1.3, "resumed": 0.7, "duplicates": 0}] * 3,
        "LangGraph": [{"seconds": 2.0, "resumed": 1.4, "duplicates": 1}] * 3}}}}
    md = report.render(timed, "")
    assert _line(md, "SIGKILL mid-run, restart → resumed")[2] == "0.70 (0.70–0.70)"
    assert _line(md, "SIGKILL mid-run, restart → run done")[2] == "1.30 (1.30–1.30)"
    assert "restart → resumed" not in report.render(RESULTS, "")  # older results, without the resume's time


def test_the_durable_harness_runs_the_timing_workload_end_to_end(tmp_path):
    """bench/peers/durable.py in its own process, as run.py starts it: one worker kept running across
    the modes and made again for another concurrency, every run completed, the process ending cleanly."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    db = tmp_path / "peers.sqlite3"
    store = json.dumps({"kind": "sqlite", "url": f"sqlite:///{db}", "path": str(db)})
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    out = subprocess.run([sys.executable, "-m", "bench.peers.workloads", "durable-ui", store, "timing", "--steps", "5",
                          "--runs", "6", "--run-steps", "2", "--concurrency", "1,3"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result["per_step"]) == {"sync", "async", "exit"}
    assert set(result["throughput"]) == {"1", "3"} and all(t["runs_per_s"] > 0 for t in result["throughput"].values())


def test_durable_uis_crash_with_effect_steps_has_rows_of_its_own():
    with_effects = {**RESULTS, "samples": {**RESULTS["samples"], "recovery_effects": {"sqlite": {
        "durable-ui": [{"seconds": 1.1, "resumed": 0.4, "duplicates": 0}] * 3}}}}
    md = report.render(with_effects, "")
    assert _line(md, "duplicate effects after that crash, effect steps, SQLite")[2:5] == ["0 (0–0)", "—", "—"]
    assert _line(md, "SIGKILL mid-run, restart → run done, effect steps")[2] == "1.10 (1.10–1.10)"
    assert _line(md, "duplicate effects after that crash, plain steps, SQLite")[2] == "1 (1–1)"  # it stays


def test_a_sigkilled_run_of_effect_steps_resumes_without_running_one_twice(tmp_path, monkeypatch):
    """bench/peers/recovery.py's crash round for real: a worker process SIGKILLed half-way through 20
    effect steps, a new one started at once. Each step lingers after its line reaches the log, so the
    kill lands while step 10 is in doubt (begun, its line written, no result recorded); the reconcile
    asks the log for its key and finds it, so no step runs twice. (A plain step would run again.)"""
    import os
    import sqlite3

    from bench.peers import recovery
    from bench.peers.databases import Store

    monkeypatch.setenv("PEERS_EFFECT_TAIL", "0.3")
    db = tmp_path / "crash.sqlite3"
    saved = {k: os.environ.pop(k) for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE") if k in os.environ}
    try:
        got = recovery.crash_round("durable-ui", Store("sqlite", f"sqlite:///{db}", path=str(db)), tmp_path,
                                   effects=True)
    finally:
        os.environ.update(saved)
    assert got["duplicates"] == 0 and got["done_before_kill"] == 10
    assert 0 < got["resumed"] < got["seconds"]
    with sqlite3.connect(db) as conn:
        in_doubt = conn.execute("SELECT position, payload FROM journal_sessionevent WHERE kind = 'effect_in_doubt'"
                                ).fetchall()
    assert [(position, '"found":true' in payload.replace(" ", "")) for position, payload in in_doubt] == [(10, True)]


def test_cpu_per_run_adds_the_servers_cpu_to_the_clients_and_the_server_row_is_postgresql_only():
    both = {**RESULTS, "samples": {**RESULTS["samples"],
                                   "run_cpu": {"postgres": {"floor": {"8": [3.0, 3.2, 2.8]},
                                                            "durable-ui": {"8": [12.0, 13.0, 11.0]}}},
                                   "per_step_server_cpu": {"postgres": {"floor": {"sync": [40.0]},
                                                                        "durable-ui": {"sync": [80.0]}}},
                                   "throughput": {**RESULTS["samples"]["throughput"], "postgres": {}}}}
    md = report.render(both, "")
    cells = _line(md, "CPU ms per run, client + server, 8 concurrent, PostgreSQL")
    assert cells[1:3] == ["3.00 (2.80–3.20)", "12.00 (11.00–13.00)"] and cells[5] == "4.00×"
    assert _line(md, "server CPU µs per step, sync, PostgreSQL")[5] == "2.00×"
    assert "server CPU µs per step, sync, SQLite" not in md


@pytest.mark.django_db
def test_the_server_cpu_of_a_local_postgresql_grows_with_the_work_it_is_given():
    """bench/peers/databases.server_cpu_seconds reads the server's processes from /proc: a query that
    keeps a backend busy shows up in it, and SQLite has no server to read."""
    from django.db import connection

    from bench.peers.databases import Store, server_cpu_seconds

    if connection.vendor != "postgresql":
        assert server_cpu_seconds(Store("sqlite", "sqlite:///x", path="x")) is None
        return
    store = Store("postgres", "postgres://unused")  # the server is found by its processes, not its address
    before = server_cpu_seconds(store)
    if before is None:
        pytest.skip("the PostgreSQL server runs on another machine: no /proc to read")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM generate_series(1, 3000000)")
    assert server_cpu_seconds(store) - before >= 0.05
